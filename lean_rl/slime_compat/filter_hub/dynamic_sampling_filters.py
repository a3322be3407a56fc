"""slime.rollout.filter_hub.dynamic_sampling_filters: keep a group only if its rewards vary."""

from __future__ import annotations

import statistics

from lean_rl.slime_compat.filter_hub.base_types import DynamicFilterOutput
from lean_rl.slime_compat.types import Sample

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def check_reward_nonzero_std(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """Keep the group when the standard deviation of its rewards exceeds 1e-6 (an all-equal group has
    zero group-relative advantage everywhere)."""
    rewards = [float(s.get_reward_value(args)) for s in samples]
    keep = len(rewards) > 1 and statistics.stdev(rewards) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output
