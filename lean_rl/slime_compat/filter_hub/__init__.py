"""slime.rollout.filter_hub: dynamic-sampling filters in slime's contract."""
