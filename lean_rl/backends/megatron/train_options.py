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
class Distillation:
    """On-policy distillation as the trainer applies it (--use-opd; lean_rl/algorithms/distillation.py):
    `kl_coef` (--opd-kl-coef); `top_k` the teacher's top-k width (--opd-estimator topk: a loss term; 0:
    sampled, a penalty in the advantage); `teacher_load` (--opd-type megatron) the teacher's checkpoint,
    which the trainer scores with, else the samples carry the teacher's scores from the rollout."""
    kl_coef: float
    top_k: int = 0
    teacher_load: str | None = None

    @staticmethod
    def of(opd) -> "Distillation | None":
        """From the run's DistillationConfig (rollout/distillation_config.py); None without --use-opd."""
        if not opd.use_opd:
            return None
        return Distillation(kl_coef=opd.opd_kl_coef, top_k=opd.top_k_if_used, teacher_load=opd.teacher_in_trainer)


@dataclass(frozen=True)
class TrainOptions:
    """What a training step needs besides the policy group and the rollout, as the run loop hands it
    over (Runtime.train_options): PPO's critic, the algorithm's switches, and the run's hooks around
    the step: `before_training(groups)` (the user's sample filter and reward post-process, in place;
    their metrics), `changing(version)` (a context the step runs in: no engine gets weights halfway,
    health checks held while colocated engines are released), `check(step, metrics)` (--ci-test)."""
    critic: "MegatronGroup | None" = None
    recompute_old: bool = False
    distillation: Distillation | None = None  # --use-opd
    before_training: Callable[[list[list[Sample]]], dict[str, float]] = _no_hooks
    changing: Callable[[int], ContextManager] = _unchanged
    check: Callable[[int, dict[str, float]], None] | None = None
