"""--data-source-path naming a slime data source class (`cls(args)` with get_samples / save / load, as
slime's RolloutDataSource subclasses are): it becomes lean_rl's prompt source (buffer/user_source.py:
next(), state_dict(), load_state_dict()). lean_rl's buffer makes the groups, so one prompt is taken
from the source at a time (the first sample of a group of get_samples(1)); the source's own cursor
is kept by its save(k) / load(k), k counting lean_rl's checkpoints of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lean_rl.buffer.prompt_source import PromptRecord, load_tokenizer
from lean_rl.slime_compat.args import slime_args
from lean_rl.slime_compat.hooks import Wrapped
from lean_rl.slime_compat.types import Sample as SlimeSample
from lean_rl.utils.plugins import hook_return_error

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

FLAG = "--data-source-path"


class SlimeSourceFactory(Wrapped):
    """What lean_rl's buffer calls with the run's Config: the slime class built with slime's `args`."""

    def __call__(self, cfg: Config) -> "SlimeSource":
        return SlimeSource(self.fn(slime_args(cfg)), cfg, self.flag)


class SlimeSource:
    def __init__(self, source, cfg: Config, flag: str):
        self.source, self.cfg, self.flag = source, cfg, flag
        self.taken = 0  # prompts taken: the row of the next one when the source gives none
        self.saves = 0

    def next(self) -> tuple[int, PromptRecord] | None:
        groups = self.source.get_samples(1)
        if not groups:
            return None
        expected = "a list of groups, each a non-empty list of slime Samples"
        if not (isinstance(groups, list) and isinstance(groups[0], list) and groups[0]
                and isinstance(groups[0][0], SlimeSample)):
            raise hook_return_error(f"{self.flag} get_samples(1)", self.source.get_samples, groups, expected)
        sample = groups[0][0]
        metadata = dict(sample.metadata) if isinstance(sample.metadata, dict) else {}
        row = metadata.get("prompt_row", self.taken + 1)
        self.taken += 1
        prompt = sample.prompt
        return int(getattr(self.source, "epoch_id", 0) or 0), PromptRecord(
            row=int(row), prompt=prompt, tokens=tuple(self._tokens(sample)), label=sample.label, metadata=metadata)

    def _tokens(self, sample: SlimeSample) -> list[int]:
        """The prompt's ids as slime tokenizes what its source hands out: its tokens when set, else the
        (already rendered) text, or the messages with the chat template; a scalar prompt has none."""
        if sample.tokens:
            return [int(t) for t in sample.tokens]
        if isinstance(sample.prompt, (str, list)):
            tokenizer = load_tokenizer(self.cfg.engines.model_path)
            if isinstance(sample.prompt, list):
                return list(tokenizer.apply_chat_template(sample.prompt, tokenize=True, add_generation_prompt=True))
            return tokenizer.encode(sample.prompt, add_special_tokens=False)
        return []

    def state_dict(self) -> dict[str, Any]:
        self.saves += 1
        self.source.save(self.saves)  # slime's source writes its own state under --save
        return {"slime_source_save": self.saves, "taken": self.taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saves, self.taken = int(state["slime_source_save"]), int(state["taken"])
        self.source.load(self.saves)


def is_slime_source(factory) -> bool:
    """A slime data source class: it has slime's get_samples where lean_rl's sources have next()."""
    return isinstance(factory, type) and callable(getattr(factory, "get_samples", None)) \
        and not callable(getattr(factory, "next", None))
