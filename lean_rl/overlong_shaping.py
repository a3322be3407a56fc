"""DAPO's over-long shaping on the groups of a training step (train_hooks.before_training, every loop
and mode), before the sample filter and the reward post-process see them: --overlong-buffer-len adds
the soft over-long penalty (lean_rl/algorithms/overlong.py) to each sample's reward, and
--overlong-filtering zeroes the loss mask of each TRUNCATED sample (cut off by the response budget), which
still counts in its group's statistics. FAILED samples are left alone (they are never trained on).
Evaluation rewards are not shaped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lean_rl.algorithms.overlong import overlong_penalty
from lean_rl.options import ConfigError
from lean_rl.sample import Sample, Status

if TYPE_CHECKING:
    from lean_rl.rollout.config import RewardConfig

PENALTY_KEY = "overlong_penalty"  # sample.metadata: the penalty added to its reward


def check_overlong_flags(reward: RewardConfig, max_response_len: int) -> None:
    length = reward.overlong_buffer_len
    if length is not None and length > max_response_len:
        raise ConfigError(f"--overlong-buffer-len {length} is more than --rollout-max-response-len {max_response_len} "
                          "(the buffer is the last part of the response budget)")


def shape_overlong(reward: RewardConfig, max_response_len: int, groups: list[list[Sample]]) -> dict[str, float]:
    """Apply the penalty and the filter in place; their metrics (none when both are off)."""
    if reward.overlong_buffer_len is None and not reward.overlong_filtering:
        return {}
    penalties, filtered, samples = [], 0, 0
    for sample in (s for group in groups for s in group if s.status != Status.FAILED):
        samples += 1
        if reward.overlong_buffer_len is not None and sample.reward is not None:
            penalty = overlong_penalty(sample.response_length, max_response_len, reward.overlong_buffer_len,
                                       reward.overlong_penalty_factor)
            sample.metadata[PENALTY_KEY] = penalty
            sample.reward += penalty
            penalties.append(penalty)
        if reward.overlong_filtering and sample.status == Status.TRUNCATED:
            sample.loss_mask = [0] * sample.response_length
            filtered += 1
    metrics = {}
    if reward.overlong_buffer_len is not None:
        metrics["train/overlong_penalty_mean"] = sum(penalties) / len(penalties) if penalties else 0.0
        metrics["train/overlong_penalized_frac"] = sum(p < 0 for p in penalties) / max(1, samples)
    if reward.overlong_filtering:
        metrics["train/overlong_filtered_frac"] = filtered / max(1, samples)
    return metrics
