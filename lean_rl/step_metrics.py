"""The metrics a loop logs for one step: the rollout's and the trainer's, the phase timers, idle time
per side, the probe of the sync, and (async loops) the staleness of what was trained."""

from __future__ import annotations

from lean_rl.rollout.base import RolloutOutput
from lean_rl.sample import Sample


# The phases a loop times; whatever else a step spends is framework overhead (data conversion in the
# driver, bookkeeping, logging).
PHASES = ("generate", "wait_for_data", "train", "sync", "save", "eval")


def step_metrics(step_seconds: float, timers: dict[str, float], rollout: RolloutOutput, train: dict[str, float],
                 extra: dict[str, float] | None = None, generate_active_s: float = 0.0) -> dict[str, float]:
    """One step's metrics. Idle time per side: the trainer is idle whenever it is not training, the
    engines whenever they are not generating (`generate_active_s` within this step)."""
    clash = rollout.metrics.keys() & train.keys()
    if clash:  # one key, one meaning: neither side may overwrite the other's
        raise ValueError(f"metrics written by both the rollout and the trainer: {sorted(clash)}")
    in_phases = sum(timers.get(f"time/{phase}", 0.0) for phase in PHASES)
    train_s = timers.get("time/train", 0.0)
    metrics = {**rollout.metrics, **train, **timers, **(extra or {}), "time/step": step_seconds,
               "time/trainer_idle": max(step_seconds - train_s, 0.0),
               "time/engine_idle": max(step_seconds - generate_active_s, 0.0),
               "perf/overhead_frac": max(step_seconds - in_phases, 0.0) / max(step_seconds, 1e-9)}
    tokens = rollout.metrics.get("rollout/response_tokens")
    if tokens and step_seconds:
        metrics["perf/tokens_per_s"] = tokens / step_seconds
    return metrics


def probe_metrics(probe) -> dict[str, float]:
    """The probe of a sync (ProbeResult): the worst engine's max and mean |Δ log p| (the mean is what
    a 16-bit sync is judged by: weight_sync/config.py probe_statistic)."""
    return {"sync/probe_max_abs_diff": probe.max_abs_diff, "sync/probe_mean_abs_diff": probe.mean_abs_diff,
            "sync/probe_image_tokens": float(probe.image_tokens)}  # > 0: the probe's prompt had an image


def staleness_metrics(groups: list[list[Sample]], step: int) -> dict[str, float]:
    """How many versions behind the trained policy (`step`) the oldest token of each sample was."""
    ages = [step - s.oldest_version for g in groups for s in g if s.oldest_version is not None]
    return {"train/staleness_max": float(max(ages, default=0)),
            "train/staleness_mean": sum(ages) / len(ages) if ages else 0.0}


def run_counters(buffer, monitor, weight_sync) -> dict[str, float]:
    """The run's running counts, logged with every step: the buffer's, engine restarts (and of the
    router), engines given the current weights after a restart, syncs done again after losing one."""
    counters: dict[str, float] = {}
    if buffer is not None:
        counters.update({f"buffer/{k}": v for k, v in buffer.get_counters().items()})
    if monitor is not None:
        counters["engines/restarts"] = monitor.total_restarts
        counters["engines/router_restarts"] = monitor.router_restarts
    if weight_sync is not None:
        counters["engines/rejoins"] = weight_sync.rejoins
        counters["sync/recoveries"] = weight_sync.recoveries
    return counters
