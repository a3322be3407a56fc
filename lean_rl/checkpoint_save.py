"""Writing one checkpoint of the run: the critic first (the actor's checkpoint, which holds the
buffer's state, is what a resume starts from, so its step must have a critic), then the actor. A save
that fills the disk ends in one line, and the last checkpoint stays loadable (preflight.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from lean_rl.preflight import save_filled_the_disk, save_space_error

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.train_config import CheckpointConfig


def write_checkpoint(ckpt: CheckpointConfig, step: int, state: dict, trainer: MegatronGroup,
                     critic: MegatronGroup | None, trainer_turn: Callable[[], AbstractContextManager]) -> None:
    """Runs on a thread (the event loop keeps serving). A save after a signal comes outside a trainer
    turn: colocated on GPU the trainer is offloaded then, and takes the devices back for it."""
    save_dir, critic_dir = ckpt.save, ckpt.critic_save_dir
    if save_dir is None or (critic is not None and critic_dir is None):
        raise ValueError("write_checkpoint: called without --save (Runtime.save saves only with it)")
    try:
        with trainer_turn():
            if critic is not None and critic_dir is not None:
                critic.save_checkpoint(critic_dir, step)
            trainer.save_checkpoint(save_dir, step, state)
    except Exception as err:
        if not save_filled_the_disk(err, save_dir):
            raise
        raise save_space_error(save_dir, step) from None  # one line; the last checkpoint stays
