"""--rollout-function-path / --eval-function-path written for slime:

    generate_rollout(args, rollout_id, data_source, evaluation=False)
        -> list[list[Sample]] | RolloutFnTrainOutput            (training)
        -> RolloutFnEvalOutput | {name: {"rewards": [...], "samples": [...], ...}}   (evaluation)

The function gets slime's `args`, and lean_rl's buffer as a slime data source (BufferDataSource:
get_samples hands out the buffer's prompt groups as slime Samples, add_samples hands groups back to
it). What it returns is converted back (convert.py: versions from the /generate answers its `post`
calls saw, statuses, prompts), scored where it left a reward unset (lean_rl's --rm-type /
--custom-rm-path; a dict reward reduced by --reward-key) and put into the buffer for training. A
group handed out and neither returned nor handed back goes back to the buffer as it was handed out:
no prompt is lost."""

from __future__ import annotations

import collections
import inspect
import time
from typing import TYPE_CHECKING, Any

from lean_rl.rollout.base import RolloutOutput, installed_extensions
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.rollout.reward_scoring import reward_key, score_group
from lean_rl.sample import Sample, Status
from lean_rl.slime_compat.async_utils import run
from lean_rl.slime_compat.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from lean_rl.slime_compat.convert import from_slime, to_slime
from lean_rl.slime_compat.hooks import Wrapped
from lean_rl.slime_compat.outside_samples import is_outside_group, outside_group
from lean_rl.slime_compat.router_gateway import rollout_args
from lean_rl.slime_compat.run_state import GenerateAnswer, recording
from lean_rl.slime_compat.types import Sample as SlimeSample
from lean_rl.utils.plugins import hook_return_error

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config


class BufferDataSource:
    """lean_rl's buffer answering slime's DataSource calls for one call of a rollout function."""

    def __init__(self, cfg: Config, buffer: DataBuffer | None, answers: list[GenerateAnswer], flag: str):
        self.cfg, self.buffer, self.answers, self.flag = cfg, buffer, answers, flag
        self.handed_out: dict[int, list[Sample]] = {}  # group_index -> the buffer's group as handed out
        self.handed_back: set[int] = set()

    def get_samples(self, num_samples: int) -> list[list[SlimeSample]]:
        if self.buffer is None:
            raise RuntimeError(f"{self.flag}: an evaluation has no training prompts (read args.eval_prompt_data)")
        groups = self.buffer.take_held_groups(int(num_samples))  # finished groups handed in first, as slime's
        groups += self.buffer.get_prompt_groups(int(num_samples) - len(groups))
        for group in groups:
            self.handed_out[group[0].group_index] = group
        return [[to_slime(self.cfg, s) for s in group] for group in groups]

    def add_samples(self, samples: list[list[SlimeSample]]) -> None:
        """Groups handed back (slime's partial rollout): into the buffer's pending groups, handed out
        first next time, with the tokens they hold when --partial-rollout is on (aborted there)."""
        assert self.buffer is not None
        outside = [g for g in samples if is_outside_group(g)]
        if outside:  # finished samples the function built itself (no group_index): held for get_samples
            self.buffer.hold_finished_groups([outside_group(self.cfg, g, self.answers, self.flag) for g in outside])
        samples = [g for g in samples if not is_outside_group(g)]
        back = [self.lean_group(group, stopping=True) for group in samples]
        self.handed_back.update(g[0].group_index for g in back)
        self.buffer.put_partial_groups(back)

    def lean_group(self, group: list[SlimeSample], stopping: bool) -> list[Sample]:
        if not (isinstance(group, list) and group and all(isinstance(s, SlimeSample) for s in group)):
            raise ValueError(f"{self.flag}: a group must be a non-empty list of slime Samples, got {group!r:.200}")
        out = []
        for s in group:
            original = self._original(s)
            out.append(from_slime(self.cfg, s, original, self.answers, stopping, self.flag))
        return out

    def _original(self, s: SlimeSample) -> Sample:
        group = self.handed_out.get(s.group_index)  # type: ignore[arg-type]
        if group is None:
            raise ValueError(f"{self.flag}: sample {s.index} has group_index {s.group_index}, which data_source."
                             "get_samples did not hand out in this call (keep the group_index of the samples you got)")
        # a held (finished) group's samples share slime's index (rollout_buffer's instance id), which may also
        # be another sample's buffer index: their tokens tell them apart, before any index does
        finished = next((o for o in group if o.response_length and o.tokens == list(s.tokens)), None)
        return finished or next((o for o in group if o.index == s.index), group[0])

    def get_buffer_length(self) -> int:
        """Groups handed in and not handed out yet (slime's RolloutDataSourceWithBuffer counts groups)."""
        return 0 if self.buffer is None else self.buffer.num_held()

    def get_metadata(self) -> dict:
        """The function's metadata, kept by the buffer across calls and saved with the checkpoint."""
        return {} if self.buffer is None else self.buffer.user_metadata

    def update_metadata(self, metadata: dict) -> None:
        assert self.buffer is not None
        self.buffer.user_metadata.update(metadata)

    def save(self, rollout_id) -> None:
        pass  # the buffer is saved with lean_rl's checkpoint

    def load(self, rollout_id=None) -> None:
        pass

    def __len__(self) -> int:
        return 0 if self.buffer is None else self.buffer.num_pending()


class SlimeRolloutFunction(Wrapped):
    """A slime rollout function called with lean_rl's rollout arguments (cfg, rollout_id, buffer,
    evaluation); synchronous, as slime's are (lean_rl runs it on a thread, within --rollout-timeout)."""

    def __call__(self, cfg: Config, rollout_id: int, buffer: DataBuffer | None, evaluation: bool = False
                 ) -> RolloutOutput:
        started = time.monotonic()
        with recording() as answers:  # the /generate answers of every request the function sends
            source = BufferDataSource(cfg, buffer, answers, self.flag)
            result = self.fn(rollout_args(cfg), rollout_id, source, evaluation=evaluation)
            if inspect.isawaitable(result):
                result = run(result)
        if evaluation:
            return self._evaluation_output(cfg, result)
        return self._train_output(cfg, result, source, started)

    def _train_output(self, cfg: Config, result, source: BufferDataSource, started: float) -> RolloutOutput:
        metrics = {}
        if isinstance(result, RolloutFnTrainOutput):
            result, metrics = result.samples, dict(result.metrics or {})
        if not isinstance(result, list):
            raise hook_return_error(self.flag, self.fn, result, "a list of groups of slime Samples, or a "
                                    "RolloutFnTrainOutput")
        groups = [source.lean_group(group, stopping=False) for group in result]
        counters: collections.Counter = collections.Counter()
        extensions = installed_extensions(cfg)
        for group in groups:  # rewards the function left unset: lean_rl's; a dict one reduced by --reward-key
            run(score_group(cfg, group, extensions.reward, extensions.group_reward, counters))
        returned = {g[0].group_index for g in groups}
        assert source.buffer is not None
        lost = [g for i, g in source.handed_out.items() if i not in returned and i not in source.handed_back]
        if lost:  # neither trained nor handed back: the prompts go back to the buffer, as handed out
            source.buffer.put_partial_groups(lost)
            counters["groups_returned_unused"] += len(lost)
        source.buffer.put_finished_groups(groups)
        out = rollout_metrics(groups, time.monotonic() - started, counters)
        out.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        return RolloutOutput(metrics=out)

    def _evaluation_output(self, cfg: Config, result) -> RolloutOutput:
        data = result.data if isinstance(result, RolloutFnEvalOutput) else result
        expected = "a RolloutFnEvalOutput, or {name: {'rewards': [...], 'samples': [...] (optional)}}"
        if not isinstance(data, dict) or not all(isinstance(v, dict) and "rewards" in v for v in data.values()):
            raise hook_return_error(self.flag, self.fn, result, expected)
        out = RolloutOutput()
        for name, entry in data.items():
            rewards = [_reward_value(r, reward_key(cfg, evaluation=True)) for r in entry["rewards"]]
            out.metrics[f"eval/{name}/reward_mean"] = sum(rewards) / max(1, len(rewards))
            if entry.get("truncated"):
                out.metrics[f"eval/{name}/truncated_ratio"] = sum(map(bool, entry["truncated"])) / len(entry["truncated"])
            samples = [s for s in entry.get("samples") or [] if isinstance(s, SlimeSample)]
            if samples:
                out.samples[name] = [_eval_sample(cfg, s) for s in samples]
        if isinstance(result, RolloutFnEvalOutput) and result.metrics:
            out.metrics.update({k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))})
        return out


def _reward_value(reward: Any, key: str | None) -> float:
    if isinstance(reward, dict):
        if key is None:
            raise ValueError("a dict reward in an evaluation needs --eval-reward-key or --reward-key")
        return float(reward[key])
    return float(reward)


def _eval_sample(cfg: Config, s: SlimeSample) -> Sample:
    """An evaluation sample as lean_rl dumps it (no training: its versions are not needed)."""
    reward = s.reward
    key = reward_key(cfg, evaluation=True)
    return Sample(index=s.index or 0, group_index=s.group_index or 0, prompt=s.prompt, tokens=list(s.tokens),
                  response=s.response or "", response_length=0, label=s.label,
                  reward=_reward_value(reward, key) if reward is not None else None,
                  status=Status(getattr(s.status, "value", s.status)),
                  metadata={"rewards": reward} if isinstance(reward, dict) else {})
