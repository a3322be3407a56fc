"""Writing one checkpoint of the run: the critic first (the actor's checkpoint, which holds the
buffer's state, is what a resume starts from, so its step must have a critic), then the actor. A save
that fills the disk ends in one line, and the last checkpoint stays loadable (preflight.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from lean_rl.hf_export import CheckpointHfExports
from lean_rl.preflight import save_filled_the_disk, save_space_error

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.train_config import CheckpointConfig
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config
    from lean_rl.trainer_groups import TrainerGroups
    from lean_rl.trainer_turns import TrainerTurns
    from lean_rl.utils.metrics import Timers


class Checkpoints:
    """The run's checkpoints of --save: every --save-interval rollouts and after the last, each step once."""

    def __init__(self, cfg: Config, trainers: TrainerGroups, turns: TrainerTurns, timers: Timers):
        self.ckpt, self.num_rollout = cfg.train.checkpoint, cfg.run.num_rollout
        self.trainers, self.turns, self.timers = trainers, turns, timers
        self.saved_step: int | None = None  # forgotten by a heal: the steps after its checkpoint are redone
        self.hf_exports = CheckpointHfExports(self.ckpt) if self.ckpt.save_hf else None  # --save-hf (hf_export.py)

    async def maybe_save(self, step: int, buffer: DataBuffer | None, start_step: int) -> None:
        if self.trainers.actor is None or not self.ckpt.should_save(step, last=step == self.num_rollout):
            return
        await self.save(step, buffer, start_step)

    async def save(self, step: int, buffer: DataBuffer | None, start_step: int) -> None:
        """A checkpoint at `step` (rollouts trained), once, when --save is set, and past `start_step`.
        In-flight groups are saved as pending: a resume generates them again.

        The buffer's state is taken here, on the event loop (the only writer of the buffer), and the
        checkpoint is written on a thread: meanwhile the loop keeps serving (fully async generation and
        the capture endpoint go on; a signal is noted and the run stops after this save)."""
        trainer = self.trainers.actor
        if trainer is None or not self.ckpt.save or self.saved_step == step or step <= start_step:
            return
        self.saved_step = step
        state = {"buffer": buffer.state_dict()} if buffer is not None else {}
        with self.timers("save"):
            if self.hf_exports is not None:
                await asyncio.to_thread(self.hf_exports.before_save)
            await asyncio.to_thread(write_checkpoint, self.ckpt, step, state, trainer, self.trainers.critic,
                                    self.turns.turn)
        if self.hf_exports is not None:
            self.hf_exports.after_save(step, with_critic=self.trainers.critic is not None)

    def close(self) -> None:
        """At exit: the run waits for its --save-hf exports (failures are logged as they are noticed)."""
        if self.hf_exports is not None:
            self.hf_exports.close()


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
