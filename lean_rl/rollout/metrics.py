"""The rollout/* metrics of generated groups (one source for every rollout and loop)."""

from __future__ import annotations

import collections
import statistics

from lean_rl.rollout.reward_routing import route_metrics
from lean_rl.rollout.reward_scoring import reward_entry_means
from lean_rl.sample import REMAX_BASELINE_REWARD, Sample, Status


def rollout_metrics(groups: list[list[Sample]], seconds: float | None = None,
                    counters: collections.Counter | dict | None = None) -> dict[str, float]:
    """The one source of rollout/* metrics about the generated groups (the trainer adds what it saw in
    the batch under other keys). Without `seconds` (a saved rollout, replayed): no timing metrics."""
    samples = [s for g in groups for s in g]
    statuses = collections.Counter(s.status.value for s in samples)
    n = max(len(samples), 1)
    response_tokens = sum(s.response_length for s in samples)
    # a FAILED sample (engine, router or reward fault) says nothing about the policy: left out, counted
    rewards = [s.reward for s in samples if s.reward is not None and s.status != Status.FAILED]
    entry_means = reward_entry_means(samples)  # a reward function that returned dicts: every entry
    metrics = {
        "rollout/groups": len(groups),
        "rollout/samples": len(samples),
        "rollout/response_len_mean": response_tokens / n,
        "rollout/response_tokens": response_tokens,
        "rollout/truncated_frac": statuses["truncated"] / n,
        **{f"rollout/{k}": float(v) for k, v in (counters or {}).items()},
    }
    if seconds is not None:
        metrics["rollout/seconds"] = seconds
        metrics["rollout/response_tokens_per_s"] = response_tokens / max(seconds, 1e-9)
    if rewards:
        metrics["rollout/reward_mean"] = sum(rewards) / len(rewards)
        metrics["rollout/reward_std"] = float(statistics.pstdev(rewards))
    metrics.update({f"rollout/reward/{name}_mean": mean for name, mean in entry_means.items()})
    metrics.update(route_metrics(samples))  # --reward-routes: per rewarder; the judge's failures
    # --advantage-estimator remax: the greedy response's reward, once per prompt (the sampled ones' baseline)
    greedy = [g[0].metadata[REMAX_BASELINE_REWARD] for g in groups if g and REMAX_BASELINE_REWARD in g[0].metadata]
    if greedy:
        metrics["rollout/remax_baseline_reward_mean"] = sum(greedy) / len(greedy)
    # multi-turn samples (rollout/multi_turn.py, or any generate that records metadata["turns"])
    turns = [len(s.metadata["turns"]) for s in samples if isinstance(s.metadata.get("turns"), list)]
    if turns:
        metrics["rollout/turns_mean"] = sum(turns) / len(turns)
        metrics["rollout/turns_max"] = float(max(turns))
        # episodes that went on past the first model turn: the model acted (called a tool, searched)
        metrics["rollout/multi_turn_fraction"] = sum(t > 1 for t in turns) / len(turns)
        metrics["rollout/environment_failed"] = float(sum(s.status == Status.FAILED and "environment_error" in s.metadata
                                                          for s in samples))
    return metrics
