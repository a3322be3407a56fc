"""The run's Megatron groups: the actor (resumed from --load, else started from --hf-checkpoint) and,
for PPO, the critic (resumed at the actor's step), each of the run's layout. A group that cannot
start is shut down before the error goes on."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.config import Config

logger = logging.getLogger(__name__)


def start_megatron_group(cfg: Config, role: str, *, colocated: bool, actor: MegatronGroup | None = None,
                         actor_step: int = 0, heal_from: str | None = None, placement_group=None,
                         start_timeout_s: float = 300.0) -> tuple[MegatronGroup, int, dict | None]:
    """(group, step it resumed at, extra state of that checkpoint) for `role` "actor" or "critic".
    `colocated` (--colocate): the actor's bundles also hold the engines, and the critic takes turns on
    the actor's devices (review C4). `heal_from`: a heal restarts from this checkpoint root (--save's)
    instead of --load's (trainer_init.initialize_for_training), its ranks into `placement_group` (the failed
    group's, kept under --colocate: the engines are in it)."""
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.rank_trainer import RankTrainer
    from lean_rl.backends.megatron.trainer_init import initialize_for_training

    placement = cfg.train.placement
    group = MegatronGroup(cfg.megatron, layout=cfg.layout, seed=cfg.train.seed, colocated=colocated and role == "actor",
                          call_timeout_s=placement.call_timeout_s, start_timeout_s=start_timeout_s,
                          dist_timeout_s=placement.distributed_timeout_minutes * 60,
                          colocate_with=actor if role == "critic" and colocated else None,
                          placement_group=placement_group if role == "actor" else None)
    try:
        step, state = initialize_for_training(group, cfg.train, cfg.algorithm, role=role, actor_step=actor_step,
                                              batch_plan=cfg.batch_plan, heal_from=heal_from)
        teacher = cfg.distillation.teacher_in_trainer
        if role == "actor" and teacher is not None:  # --opd-type megatron: the teacher's weights, held on the host
            group.call_all(RankTrainer.load_teacher, teacher)
            logger.info("teacher for on-policy distillation: --opd-teacher-load %s (in the trainer)", teacher)
    except BaseException:
        group.shutdown(keep_placement=placement_group is not None)
        raise
    if role == "actor" and cfg.train.lora.enabled:
        trainable = group.trainable_parameters()
        logger.info("LoRA rank %d, alpha / rank %g: %d adapter tensors, %d trainable parameters (rank 0's "
                    "pipeline stage)", cfg.train.lora.lora_rank, cfg.train.lora.scaling, len(trainable),
                    sum(trainable.values()))
    if step and heal_from is None:
        load_dir = cfg.train.checkpoint.load if role == "actor" else cfg.train.checkpoint.critic_load_dir
        logger.info("%sresumed from %s at step %d", "critic " if role == "critic" else "", load_dir, step)
    return group, step, state


def warn_nothing_left(cfg: Config, step: int) -> None:
    """A rerun of a completed run: the checkpoint is already at --num-rollout."""
    logger.warning("the checkpoint in %s is at step %d, --num-rollout is %d: nothing left to train "
                   "(raise --num-rollout to go on)", cfg.train.checkpoint.load, step, cfg.run.num_rollout)
