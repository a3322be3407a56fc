"""Applying a reward safely: score_group scores a group with the run's reward function (one sample or the
whole group at once), checks what it returned (a number, or a dict with --reward-key's entry), and turns a
failure into a FAILED sample, never into training data; reward_key and reward_entry_means read the result."""

from __future__ import annotations

import asyncio
import collections
import math
import types
from typing import TYPE_CHECKING

from lean_rl.sample import Sample, Status
from lean_rl.utils.plugins import HookReturnError, hook_return_error

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config
    from lean_rl.hook_protocols import GroupRewardFunction, RewardFunction


# ---------------------------------------------------------------- applying rewards safely
def reward_key(cfg: Config, evaluation: bool = False) -> str | None:
    """The entry of a reward dict that is trained on (--reward-key) or evaluated (--eval-reward-key,
    default --reward-key)."""
    if evaluation and cfg.eval.reward_key:
        return cfg.eval.reward_key
    return cfg.reward.reward_key


async def score_group(cfg: Config, samples: list[Sample], reward_fn: RewardFunction | GroupRewardFunction | None,
                      group_rm: bool, counters: collections.Counter, evaluation: bool = False) -> None:
    """Set `reward` on every sample. A reward the generate function already set (sample.reward not None)
    is kept and not scored again; a dict there, as from a reward function, is reduced to its
    --reward-key entry (--eval-reward-key in evaluation) and kept whole in metadata["rewards"].
    `reward_fn` None: only those. A reward that raises or times out, or returns NaN / inf, marks the
    sample FAILED with reward 0 and counts it; the run goes on. A reward that returns something that
    is not a number or a dict of numbers (a group reward: not a list of them) is a bug:
    HookReturnError stops the run."""
    key = reward_key(cfg, evaluation)
    preset = {id(s) for s in samples if s.reward is not None}
    for sample in samples:
        if id(sample) not in preset:
            continue
        if sample.status == Status.FAILED:
            sample.reward = 0.0
        else:
            _set_reward(sample, *_reward_value(cfg, None, sample.reward, key, sample.reward), counters)
    if reward_fn is None:
        for sample in samples:
            if sample.status == Status.FAILED:
                sample.reward = 0.0
        return
    timeout_s = cfg.reward.rm_timeout * 3 + 5
    if group_rm:
        if len(preset) == len(samples):
            return  # every reward came with its sample: nothing to score
        try:
            rewards = await asyncio.wait_for(reward_fn(cfg, samples), timeout=timeout_s)
        except Exception as err:  # noqa: BLE001 - user code: any failure is counted, not fatal
            for sample in samples:
                if id(sample) not in preset:
                    _mark_failed(sample, err, counters)
            return
        if not isinstance(rewards, (list, tuple)):
            raise hook_return_error(_reward_flag(cfg), reward_fn, rewards, _expected(key, group=True))
        values = [_reward_value(cfg, reward_fn, value, key, rewards, group=True) for value in rewards]
        if len(values) != len(samples):
            err = ValueError(f"group reward returned {len(values)} values for {len(samples)} samples")
            for sample in samples:
                if id(sample) not in preset:
                    _mark_failed(sample, err, counters)
            return
        for sample, (value, entries) in zip(samples, values):
            if id(sample) not in preset:
                _set_reward(sample, value, entries, counters)
        return

    waits = not getattr(reward_fn, NEVER_WAITS, False)

    async def one(sample: Sample) -> None:
        if sample.status == Status.FAILED:
            sample.reward = 0.0
            return
        if id(sample) in preset:
            return
        try:
            # not wait_for: no task of its own per sample; and no timer for a reward that never waits
            async with asyncio.timeout(timeout_s if waits else None):
                value = await reward_fn(cfg, sample)
        except Exception as err:  # noqa: BLE001
            _mark_failed(sample, err, counters)
            return
        _set_reward(sample, *_reward_value(cfg, reward_fn, value, key, value), counters)

    if waits:
        await asyncio.gather(*(one(s) for s in samples))
    else:  # nothing to wait for, so nothing to overlap or time out: no task and no timer per sample
        for sample in samples:
            await one(sample)


NEVER_WAITS = "lean_rl_never_waits"


def never_waits(reward_fn):
    """Mark a reward function whose coroutine never suspends (pure computation on the sample, as the
    built-in rule rewards): score_group calls it sample after sample in the group's task, where one that
    may wait (a model, a worker process, a user's) gets a task and a deadline per sample."""
    setattr(reward_fn, NEVER_WAITS, True)
    return reward_fn


def _reward_flag(cfg: Config) -> str:
    if cfg.reward.custom_rm_path:
        return f"--custom-rm-path {cfg.reward.custom_rm_path}"
    return f"--rm-type {cfg.reward.rm_type}"


def _preset_flag(cfg: Config) -> str:
    rollout = getattr(cfg, "rollout", None)
    return f"{rollout.generate_function_flag if rollout is not None else 'the generate function'} (sample.reward)"


def _expected(key: str | None, group: bool = False) -> str:
    one = "a number (int or float)" + (f", or a dict of numbers holding --reward-key {key!r}" if key
                                       else ", or a dict of numbers with --reward-key naming the trained one")
    return f"a list with one of these per sample: {one}" if group else one


def _reward_value(cfg: Config, reward_fn, value, key: str | None, returned,
                  group: bool = False) -> tuple[float, dict[str, float] | None]:
    """(the trained reward, the whole dict or None) from what a reward returned: a number (bool, int,
    float, numpy / torch scalars) or a dict of them holding `key`; HookReturnError otherwise.
    `reward_fn` None: a reward the generate function set."""
    expected = _expected(key, group)

    def error(detail: str = "") -> HookReturnError:
        if reward_fn is None:
            return hook_return_error(_preset_flag(cfg), _generate_fn_stand_in(cfg), returned, expected + detail)
        return hook_return_error(_reward_flag(cfg), reward_fn, returned, expected + detail)

    if isinstance(value, dict):
        entries = {}
        for name, entry in value.items():
            if not isinstance(name, str):
                raise error("; its keys must be strings")
            entries[name] = _number(entry, lambda: error(f"; entry {name!r} is not a number"))
        if key is None:
            raise error(": it returned a dict, so pass --reward-key to choose the entry that is trained on")
        if key not in entries:
            raise error(f": the dict has no entry {key!r} (--reward-key / --eval-reward-key); its keys are "
                        f"{sorted(entries)}")
        return entries[key], entries
    return _number(value, error), None


def _number(value, error) -> float:
    """float(value) for a number; `error()` (a HookReturnError) raised otherwise."""
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise error()
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a tensor of several elements
        raise error() from None


def _generate_fn_stand_in(cfg: Config):
    """What error messages name as the function when the generate function set the reward."""
    path = getattr(getattr(cfg, "rollout", None), "custom_generate_function_path", None) or \
        "lean_rl.rollout.default.generate"
    module, _, name = path.rpartition(".")
    return types.SimpleNamespace(__module__=module, __qualname__=name)


def _set_reward(sample: Sample, value: float, entries: dict[str, float] | None, counters: collections.Counter) -> None:
    if entries is not None:
        sample.metadata["rewards"] = entries
    if math.isfinite(value):
        sample.reward = value
    else:  # one sample's computation went wrong (0/0, log 0): that sample fails, the run goes on
        _mark_failed(sample, ValueError(f"the reward is {value}, not a finite number"), counters)


def _mark_failed(sample: Sample, err: Exception, counters: collections.Counter) -> None:
    sample.reward = 0.0
    sample.status = Status.FAILED
    sample.metadata["reward_error"] = f"{type(err).__name__}: {err}"
    counters["reward_failed"] += 1


def reward_entry_means(samples: list[Sample]) -> dict[str, float]:
    """Mean of every entry of the reward dicts (metadata["rewards"]) over the samples that did not
    FAIL, by entry name (non-finite values left out)."""
    values: dict[str, list[float]] = collections.defaultdict(list)
    for sample in samples:
        entries = sample.metadata.get("rewards")
        if sample.status == Status.FAILED or not isinstance(entries, dict):
            continue
        for name, value in entries.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[name].append(float(value))
    return {name: sum(v) / len(v) for name, v in values.items()}
