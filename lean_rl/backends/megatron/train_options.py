"""TrainOptions: what a training step of the run loop needs besides the policy group and the rollout
(train_driver.train_rollout). Apart from the driver so that the run loop builds it without torch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ContextManager

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.sample import Sample


def _no_hooks(groups: list[list[Sample]]) -> dict[str, float]:
    return {}


def _unchanged(version: int) -> ContextManager:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class TrainOptions:
    """What a training step needs besides the policy group and the rollout, as the run loop hands it
    over (Runtime.train_options): PPO's critic, the algorithm's switches, and the run's hooks around
    the step: `before_training(groups)` (the user's sample filter and reward post-process, in place;
    their metrics), `changing(version)` (a context the step runs in: no engine gets weights halfway,
    health checks held while colocated engines are released), `check(step, metrics)` (--ci-test)."""
    critic: "MegatronGroup | None" = None
    recompute_old: bool = False
    opd_kl_coef: float | None = None
    opd_topk: bool = False  # --opd-estimator topk (else sampled): see train_driver.train_on_rollout
    before_training: Callable[[list[list[Sample]]], dict[str, float]] = _no_hooks
    changing: Callable[[int], ContextManager] = _unchanged
    check: Callable[[int, dict[str, float]], None] | None = None
