"""Built-in dynamic-sampling filters: `def filter(cfg: Config, group: list[Sample]) -> bool`, True keeps the
group (the DynamicFilter protocol in rollout/base.py; docs/extending.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lean_rl.sample import Sample

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config


def reward_varies(cfg: Config, group: list[Sample]) -> bool:
    """Keep a group only if its rewards are not all equal: under group-relative advantages (GRPO and
    friends) an all-equal group has zero advantage everywhere and teaches nothing (DAPO's dynamic sampling)."""
    rewards = [s.reward for s in group]
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-8
