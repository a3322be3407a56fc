"""slime.rollout.data_source: slime's DataSource contract and its two readers of --prompt-data.

A slime data source hands out prompt groups as slime Samples: `get_samples(n)` -> n groups of
--n-samples-per-prompt copies, `add_samples(groups)` takes groups back, `save(rollout_id)` and
`load(rollout_id)` keep its cursor across a resume. Here the readers read --prompt-data with
lean_rl's reader (lean_rl/buffer/prompt_source.py: the same rows, keys and chat template), the
prompt handed over as slime's reader renders it (the chat text under --apply-chat-template); their
state is a JSON file under --save/rollout/ (slime writes a torch file of the same fields there).
A user's subclass runs as lean_rl's --data-source-path through source_adapter.py."""

from __future__ import annotations

import abc
import copy
import json
import logging
import os
from argparse import Namespace

from lean_rl.slime_compat.run_state import bound_config
from lean_rl.slime_compat.types import Sample

__all__ = ["DataSource", "RolloutDataSource", "RolloutDataSourceWithBuffer"]

logger = logging.getLogger(__name__)


class DataSource(abc.ABC):
    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """`num_samples` prompt groups."""

    @abc.abstractmethod
    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Groups handed back (partial rollouts, groups to retry)."""

    @abc.abstractmethod
    def save(self, rollout_id) -> None:
        """Keep the source's state for a resume at `rollout_id`."""

    @abc.abstractmethod
    def load(self, rollout_id=None) -> None:
        """Restore the state `save(rollout_id)` kept."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """How many prompts the source holds (it may change)."""


class RolloutDataSource(DataSource):
    """--prompt-data, in order (shuffled per epoch under --rollout-shuffle), read-only. The cursor is a
    lean_rl PromptSource's (epoch_id and sample_offset read from it)."""

    def __init__(self, args: Namespace):
        from lean_rl.buffer.prompt_source import PromptSource, load_prompts, load_tokenizer

        self.args = args
        self.sample_group_index = self.sample_index = 0
        self.metadata: dict = {}
        cfg = bound_config()
        self._tokenizer = load_tokenizer(cfg.engines.model_path)
        records = load_prompts(args.prompt_data, cfg.data, self._tokenizer)[0] if args.prompt_data else []
        # no prompt data: blank samples, as slime's (a rollout function that makes its own prompts)
        self._prompts = PromptSource(records, cfg.data.rollout_shuffle, cfg.data.seed) if records else None

    @property
    def epoch_id(self) -> int:
        return self._prompts.epoch if self._prompts else 0

    @property
    def sample_offset(self) -> int:
        return self._prompts.position if self._prompts else 0

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_samples):
            prompt_sample = Sample()
            if self._prompts is not None:
                item = self._prompts.next()  # endless (no epoch limit): never None
                assert item is not None
                record = item[1]
                prompt_sample = Sample(prompt=self._rendered(record), label=record.label,
                                       metadata=dict(record.metadata))
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                sample = copy.deepcopy(prompt_sample)
                sample.group_index, sample.index = self.sample_group_index, self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def _rendered(self, record):
        if self.args.apply_chat_template and record.tokens:
            return self._tokenizer.decode(list(record.tokens), skip_special_tokens=False)
        return record.prompt

    def add_samples(self, samples: list[list[Sample]]) -> None:
        raise RuntimeError(f"{type(self).__name__} is read-only: it takes no samples back")

    def _state_path(self, directory: str | None, rollout_id) -> str | None:
        return os.path.join(directory, "rollout", f"global_dataset_state_dict_{rollout_id}.json") if directory else None

    def save(self, rollout_id) -> None:
        path = self._state_path(self.args.save, rollout_id)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"sample_offset": self.sample_offset, "epoch_id": self.epoch_id,
                       "sample_group_index": self.sample_group_index, "sample_index": self.sample_index,
                       "metadata": self.metadata}, f)

    def load(self, rollout_id=None) -> None:
        path = self._state_path(self.args.load, rollout_id)
        if path is None or not os.path.exists(path):
            logger.info("slime data source: no state at %s; starting from the first prompt", path)
            return
        with open(path) as f:
            state = json.load(f)
        self.sample_group_index, self.sample_index = state["sample_group_index"], state["sample_index"]
        self.metadata = state["metadata"]
        if self._prompts is not None:
            self._prompts.load_state_dict({"epoch": state["epoch_id"], "position": state["sample_offset"],
                                           "num_records": len(self)})

    def __len__(self) -> int:
        return len(self._prompts.records) if self._prompts else 0


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """The reader, with groups handed back (add_samples) handed out again first."""

    def __init__(self, args: Namespace):
        super().__init__(args)
        self.buffer: list[list[Sample]] = []

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        taken, self.buffer = self.buffer[:num_samples], self.buffer[num_samples:]
        return taken + super().get_samples(num_samples - len(taken))

    def add_samples(self, samples: list[list[Sample]]) -> None:
        for group in samples:
            if not (isinstance(group, list) and all(isinstance(s, Sample) for s in group)):
                raise TypeError(f"add_samples takes a list of groups (lists of Samples), got {type(group).__name__}")
            self.buffer.append(group)

    def update_metadata(self, metadata: dict) -> None:
        self.metadata.update(metadata)

    def get_metadata(self) -> dict:
        return self.metadata

    def get_buffer_length(self) -> int:
        return len(self.buffer)
