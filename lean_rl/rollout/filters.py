"""Built-in dynamic-sampling filters: `filter(cfg, group) -> bool`, True keeps the group."""

from lean_rl.sample import Sample


def reward_varies(cfg, group: list[Sample]) -> bool:
    """Keep a group only if its rewards are not all equal: under group-relative advantages (GRPO and
    friends) an all-equal group has zero advantage everywhere and teaches nothing (DAPO's dynamic sampling)."""
    rewards = [s.reward for s in group]
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-8
