"""A group made ready to train: its optimizer, LR schedule and batch plan set up (MegatronGroup.setup_training),
then its weights from where the run starts: the checkpoint it resumes (--load's latest complete step, or a
heal's --save), else --hf-checkpoint; PPO's critic at the actor's step. Returns the step and the extra
state of that checkpoint (the buffer's)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.backends.megatron.rank_trainer import RankTrainer
from lean_rl.backends.megatron.train_config import TrainConfig
from lean_rl.options import ConfigError

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup

logger = logging.getLogger(__name__)


def latest_resume_step(root, flag: str) -> int | None:
    """The step --load's tracker names (None: no checkpoint yet, a fresh start); a ConfigError naming the
    flag when --load is not a directory, or its tracker is garbage or names a step that is missing."""
    from pathlib import Path

    from lean_rl.backends.megatron.checkpoint_paths import latest_step

    if Path(root).exists() and not Path(root).is_dir():
        raise ConfigError(f"{flag} {root}: not a directory (give the checkpoint root that --save wrote)")
    try:
        return latest_step(root)
    except (ValueError, OSError) as err:
        raise ConfigError(f"{flag} {root}: {err}; the checkpoint root is damaged: fix the tracker, or point "
                          f"{flag} at another root (nothing was loaded)") from None


def initialize_for_training(group: "MegatronGroup", train: TrainConfig, algo: AlgorithmConfig,
                            role: str = "actor", actor_step: int = 0, batch_plan: BatchPlan | None = None,
                            heal_from: str | None = None) -> tuple[int, dict | None]:
    """Weights, reference and optimizer of `group` as `role` from the flags; returns (step,
    extra_state) of a resumed checkpoint, else (0, None). Where the weights come from, as a slime user
    expects:
    - resume: --load (critic: --critic-load, default LOAD/critic) holds a complete checkpoint -> load
      it (any layout). The critic of a resumed actor (actor_step > 0) loads its checkpoint of that
      same step: the driver saves the critic before the actor, so the actor's step always has one;
    - a heal (lean_rl/trainer_heal.py): `heal_from`, the --save root (critic: its critic root) that holds
      the run's last checkpoint, stands for --load;
    - else start from --hf-checkpoint;
    - reference (when a KL term needs it): --ref-load, else the --hf-checkpoint weights (the policy's
      starting point), loaded before any resume so a resumed run keeps the same reference."""
    from lean_rl.backends.megatron.checkpoint_paths import has_step
    from lean_rl.backends.megatron.hf_config import hf_family

    ckpt = train.checkpoint
    load_root, load_flag = (ckpt.load, "--load") if role == "actor" else (ckpt.critic_load_dir, "--critic-load")
    if heal_from is not None:
        load_root, load_flag = heal_from, "--save" if role == "actor" else "--critic-save"
    resume = load_root is not None and latest_resume_step(load_root, load_flag) is not None
    if role == "critic" and actor_step:
        if load_root is None or not has_step(load_root, actor_step):
            raise ConfigError(f"the actor resumed at step {actor_step}, but the critic has no checkpoint of that step "
                              f"({load_flag} {load_root}); point --critic-load at the critic saved with it")
        resume = True
    hf = ckpt.hf_checkpoint
    if not resume and hf is None:
        raise ConfigError(f"nothing to start the {role} from: {load_flag} {load_root} holds no checkpoint and "
                          "--hf-checkpoint is not set")
    if role == "actor" and algo.needs_reference and ckpt.ref_load is None and hf is None:
        raise ConfigError("--kl-loss-coef / --kl-coef need a reference model: --ref-load or --hf-checkpoint")
    reference_from_hf = role == "actor" and algo.needs_reference and ckpt.ref_load is None
    if hf is not None and (not resume or reference_from_hf):
        group.load_hf_checkpoint(hf)
    elif hf is not None:  # resuming: the checkpoint has the weights; the family names them for export
        group.family = hf_family(hf)
    group.setup_training(train, algo, role, batch_plan)
    if role == "actor" and algo.needs_reference:
        if ckpt.ref_load is not None:
            group.call_all(RankTrainer.load_reference, str(ckpt.ref_load))
        else:
            group.call_all(RankTrainer.snapshot_reference)
    if resume:
        step, extra = group.load_checkpoint(load_root, step=actor_step or None)
        logger.info("%s: resumed from %s %s at step %d", role, load_flag, load_root, step)
        return step, extra
    logger.info("%s: started from --hf-checkpoint %s%s", role, hf,
                f" ({load_flag} {load_root} holds no checkpoint yet)" if load_root else "")
    return 0, None
