"""A slime-style user hook wrapped into lean_rl's contract (lean_rl/extensions.py chooses).

A hook is slime-style when its module imports slime (served by lean_rl/utils/slime_finder.py, or the real one): then
it gets slime's `args` (args.py) and slime Samples (convert.py), and what it returns is read as
slime reads it. Hooks whose contract is the same in both (the rollout's reward functions aside)
need no wrapper; those that differ:

  generate           f(args, sample, sampling_params[, evaluation=]) -> Sample | list[Sample]
  reward             async f(args, sample) -> float | dict   (--group-rm: f(args, samples) -> list)
  dynamic filter     f(args, samples) -> bool | DynamicFilterOutput
  sample filter      f(args, groups) sets sample.remove_sample, once per rollout
  reward post-proc.  f(args, samples) -> (raw_rewards, rewards), once per rollout, samples flattened
  all-samples proc.  f(args, groups, data_source), data_source None here (lean_rl's buffer is no slime data source)
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING

from lean_rl.rollout.base import rollout_stopping
from lean_rl.sample import Sample
from lean_rl.slime_compat.args import slime_args
from lean_rl.slime_compat.convert import from_slime, keep_reward_details, to_slime
from lean_rl.slime_compat.filter_hub.base_types import DynamicFilterOutput
from lean_rl.slime_compat.router_gateway import rollout_args
from lean_rl.slime_compat.run_state import recording
from lean_rl.slime_compat.types import Sample as SlimeSample
from lean_rl.utils.plugins import dotted_name, hook_return_error, is_slime_function  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

logger = logging.getLogger(__name__)


class Wrapped:
    """A user's function (or class) behind lean_rl's contract for its flag; named as the user's."""

    def __init__(self, fn, flag: str):
        self.fn, self.flag = fn, flag
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", None) or type(fn).__module__
        self.__wrapped__ = fn  # error messages and dotted_name() name the user's function


class SampleHooks:
    """--rollout-sample-hook-path (repeatable): `hook(args, sample, *, rollout_id=None, evaluation=False)
    -> Sample | None`, sync or async, applied in order to every generated sample before its reward (a
    returned Sample replaces it). lean_rl's generate call does not know the rollout id: None."""

    def __init__(self, hooks: list, paths: list[str]):
        self.hooks, self.paths = hooks, paths

    async def apply(self, args, sample: SlimeSample, evaluation: bool) -> SlimeSample:
        for hook, path in zip(self.hooks, self.paths):
            result = hook(args, sample, **_accepted(hook, {"rollout_id": None, "evaluation": evaluation}))
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                if not isinstance(result, SlimeSample):
                    raise hook_return_error(f"--rollout-sample-hook-path {path}", hook, result,
                                            "a slime Sample, or None (the sample changed in place)")
                sample = result
        return sample


def _accepted(fn, kwargs: dict) -> dict:
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return kwargs
    names = {p.name for p in parameters}
    return {k: v for k, v in kwargs.items() if k in names}


class HookedGenerate(Wrapped):
    """A lean_rl generate function followed by --rollout-sample-hook-path's hooks (on slime samples:
    the hooks are slime's; versions of the tokens the generate made are kept)."""

    def __init__(self, fn, call, flag: str, hooks: SampleHooks):
        super().__init__(fn, flag)
        self.call, self.hooks = call, hooks

    async def __call__(self, cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False):
        result = await self.call(cfg, sample, sampling_params, evaluation)
        if not (isinstance(result, Sample) or (isinstance(result, list) and all(isinstance(r, Sample) for r in result))):
            return result  # the run's own check names the flag and what came back
        args, stopping = slime_args(cfg), rollout_stopping()
        out = [from_slime(cfg, await self.hooks.apply(args, to_slime(cfg, s), evaluation), s, [], stopping, self.flag)
               for s in (result if isinstance(result, list) else [result])]
        return out if isinstance(result, list) else out[0]


class SlimeGenerate(Wrapped):
    """--custom-generate-function-path: (cfg, sample, sampling_params, evaluation) -> lean_rl Sample(s)."""

    def __init__(self, fn, flag: str, hooks: SampleHooks | None = None):
        super().__init__(fn, flag)
        self.hooks = hooks

    async def __call__(self, cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False):
        args = rollout_args(cfg)
        slime = to_slime(cfg, sample)
        with recording() as answers:
            if "evaluation" in inspect.signature(self.fn).parameters:
                result = await self.fn(args, slime, sampling_params, evaluation=evaluation)
            else:
                result = await self.fn(args, slime, sampling_params)
        results = result if isinstance(result, list) else [result]
        if not results or not all(isinstance(r, SlimeSample) for r in results):
            raise hook_return_error(self.flag, self.fn, result, "a slime Sample, or a non-empty list of them")
        if self.hooks is not None:
            results = [await self.hooks.apply(args, r, evaluation) for r in results]
        stopping = rollout_stopping()
        out = [from_slime(cfg, r, sample, answers, stopping, self.flag) for r in results]
        return out if isinstance(result, list) else out[0]


class SlimeReward(Wrapped):
    """--custom-rm-path: (cfg, sample) -> reward, or (cfg, samples) -> rewards with --group-rm."""

    async def __call__(self, cfg: Config, sample_or_group):
        args = slime_args(cfg)
        if isinstance(sample_or_group, list):
            values = await self.fn(args, [to_slime(cfg, s) for s in sample_or_group])
            if isinstance(values, (list, tuple)) and len(values) == len(sample_or_group):
                return [keep_reward_details(cfg, s.metadata, v) for s, v in zip(sample_or_group, values)]
            return values  # the run's own check names the flag and what came back
        return keep_reward_details(cfg, sample_or_group.metadata, await self.fn(args, to_slime(cfg, sample_or_group)))


class SlimeDynamicFilter(Wrapped):
    """--dynamic-sampling-filter-path: (cfg, group) -> bool. A DynamicFilterOutput's reason is kept in
    each sample's metadata["dynamic_filter_reason"]; keep_when_insufficient is not needed (lean_rl tops
    the batch up while groups are dropped), so a rejected group is dropped."""

    def __call__(self, cfg: Config, group: list[Sample]) -> bool:
        output = self.fn(slime_args(cfg), [to_slime(cfg, s) for s in group])
        if isinstance(output, DynamicFilterOutput):
            if not output.keep and output.reason:
                for sample in group:
                    sample.metadata["dynamic_filter_reason"] = output.reason
            output = output.keep
        return bool(output)  # slime reads its truth value (a bool, a numpy or torch scalar)


class WholeRolloutHook(Wrapped):
    """A slime hook called once with the whole rollout (lean_rl/train_hooks.py calls `over_groups`)."""

    def __call__(self, cfg: Config, group: list[Sample]):
        return self.over_groups(cfg, [group])[0]

    def over_groups(self, cfg: Config, groups: list[list[Sample]]) -> list[list]:
        raise NotImplementedError


class SlimeSampleFilter(WholeRolloutHook):
    """--rollout-sample-filter-path: f(args, groups) sets remove_sample -> one verdict per sample."""

    def over_groups(self, cfg: Config, groups: list[list[Sample]]) -> list[list[bool]]:
        slime_groups = [[to_slime(cfg, s) for s in group] for group in groups]
        self.fn(slime_args(cfg), slime_groups)
        return [[not bool(s.remove_sample) for s in group] for group in slime_groups]


class SlimeRewardPostProcess(WholeRolloutHook):
    """--custom-reward-post-process-path: f(args, samples) -> (raw_rewards, rewards) over the rollout."""

    def over_groups(self, cfg: Config, groups: list[list[Sample]]) -> list[list[float]]:
        flat = [to_slime(cfg, s) for group in groups for s in group]
        returned = self.fn(slime_args(cfg), flat)
        expected = f"(raw_rewards, rewards), each a list of {len(flat)} numbers (one per sample of the rollout)"
        if not (isinstance(returned, tuple) and len(returned) == 2):
            raise hook_return_error(self.flag, self.fn, returned, expected)
        rewards = returned[1]
        rewards = rewards.tolist() if hasattr(rewards, "tolist") else rewards
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(flat):
            raise hook_return_error(self.flag, self.fn, returned, expected)
        out, i = [], 0
        for group in groups:
            out.append(list(rewards[i:i + len(group)]))
            i += len(group)
        return out


class SlimeAllSamplesProcess(Wrapped):
    """--rollout-all-samples-process-path: (cfg, groups, rollout_id) -> f(args, slime groups, None)."""

    def __call__(self, cfg: Config, groups: list[list[Sample]], rollout_id: int):
        return self.fn(slime_args(cfg), [[to_slime(cfg, s) for s in group] for group in groups], None)


def describe(fn) -> str:
    return dotted_name(getattr(fn, "__wrapped__", fn))
