"""The user hooks that run on the groups of a training step just before the trainer takes them
(train_driver.train_rollout, every loop and mode): --rollout-sample-filter-path, then
--custom-reward-post-process-path. Both are plain `def`s called once per group, in the driver's
training thread.

Sample filter (slime's remove_sample): a rejected sample is not trained on (its loss mask becomes 0,
so it weighs nothing in the loss and counts in no loss denominator) but stays in its group's
statistics: the group baseline and normalisation still see its reward, as in slime. To leave a
sample out of the statistics too, mark it FAILED in the rollout instead.

Reward post-process (slime's custom reward post-process): the group's rewards -> the rewards the
advantage estimator gets. The raw reward is kept in metadata["raw_reward"]; --advantage-estimator
(or --custom-advantage-function-path) still runs on the new values. A FAILED sample keeps reward 0
and is left out whatever the hook says."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lean_rl.overlong_shaping import shape_overlong
from lean_rl.sample import Sample, Status
from lean_rl.slime_compat.hooks import WholeRolloutHook
from lean_rl.utils.plugins import hook_return_error

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config
    from lean_rl.hook_protocols import Extensions


def before_training(cfg: Config, extensions: Extensions, groups: list[list[Sample]]) -> dict[str, float]:
    """Apply DAPO's over-long shaping, the sample filter, then the reward post-process, to `groups` in
    place; their metrics."""
    metrics = shape_overlong(cfg.reward, cfg.rollout.sampling.max_response_len, groups)
    if extensions.sample_filter is not None:
        metrics["train/samples_rejected"] = float(apply_sample_filter(cfg, extensions.sample_filter, groups))
    if extensions.reward_post_process is not None:
        raw = post_process_rewards(cfg, extensions.reward_post_process, groups)
        if raw:
            metrics["train/raw_reward_mean"] = sum(raw) / len(raw)
    return metrics


def apply_sample_filter(cfg: Config, filter_fn, groups: list[list[Sample]]) -> int:
    """Zero the loss mask of every sample the filter rejects (marked metadata["sample_filter"] =
    "rejected"); returns how many it rejected."""
    flag = f"--rollout-sample-filter-path {cfg.rollout.rollout_sample_filter_path}"
    rejected = 0
    # slime's filter sees the whole rollout at once
    every = filter_fn.over_groups(cfg, groups) if isinstance(filter_fn, WholeRolloutHook) else None
    for number, group in enumerate(groups):
        verdicts = every[number] if every is not None else filter_fn(cfg, group)
        expected = f"a list of {len(group)} bools, one per sample of the group (True: train on it)"
        if not isinstance(verdicts, (list, tuple)) or len(verdicts) != len(group) or not all(_is_bool(v) for v in verdicts):
            raise hook_return_error(flag, filter_fn, verdicts, expected)
        for sample, keep in zip(group, verdicts):
            if not keep:
                sample.loss_mask = [0] * sample.response_length
                sample.metadata["sample_filter"] = "rejected"
                rejected += 1
    return rejected


def post_process_rewards(cfg: Config, post_process, groups: list[list[Sample]]) -> list[float]:
    """Replace each sample's reward by the hook's value (FAILED samples excepted), keeping the raw one in
    metadata["raw_reward"]; returns the raw rewards of the samples that did not fail."""
    flag = f"--custom-reward-post-process-path {cfg.reward.custom_reward_post_process_path}"
    raw: list[float] = []
    # slime's post-process sees the whole rollout at once
    every = post_process.over_groups(cfg, groups) if isinstance(post_process, WholeRolloutHook) else None
    for number, group in enumerate(groups):
        values = every[number] if every is not None else post_process(cfg, group)
        expected = f"a list of {len(group)} finite numbers, one per sample of the group (the rewards for the advantages)"
        if not isinstance(values, (list, tuple)) or len(values) != len(group):
            raise hook_return_error(flag, post_process, values, expected)
        numbers = []
        for value in values:
            if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
                raise hook_return_error(flag, post_process, values, expected)
            numbers.append(float(value))
        for sample, value in zip(group, numbers):
            if sample.status == Status.FAILED:
                continue
            if not math.isfinite(value):  # e.g. 0/0 from a zero std: every later step would be skipped
                raise hook_return_error(flag, post_process, values, f"{expected}; sample {sample.index} "
                                        f"(group {sample.group_index}) got {value}")
            if sample.reward is not None:
                raw.append(sample.reward)
            sample.metadata["raw_reward"] = sample.reward
            sample.reward = value
    return raw


def _is_bool(value) -> bool:
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))
