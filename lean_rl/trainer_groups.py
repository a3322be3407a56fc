"""The run's trainer groups: the actor and, for PPO, the critic (each started by trainer_start.py), and
under --colocate the placement group a lost actor leaves to its successor: the engines live in its
bundles, so a heal (trainer_heal.py) shuts the ranks down, keeps it, and starts the new actor into it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from lean_rl.trainer_start import start_megatron_group

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.config import Config
    from lean_rl.trainer_turns import TrainerTurns

logger = logging.getLogger(__name__)


class TrainerGroups:
    def __init__(self, cfg: Config, colocated: bool, turns: TrainerTurns):
        self.cfg, self.colocated, self.turns = cfg, colocated, turns
        self.actor: MegatronGroup | None = None
        self.critic: MegatronGroup | None = None  # PPO's value model: a second group of the same layout
        self._kept_placement = None  # --colocate: the lost actor's placement group, between heal steps

    def start(self) -> tuple[int, dict | None]:
        """The actor, then PPO's critic (none on a rerun past --num-rollout); returns (step resumed at,
        extra state of that checkpoint)."""
        cfg = self.cfg
        self.actor, step, state = start_megatron_group(cfg, "actor", colocated=self.colocated)
        if step < cfg.run.num_rollout and cfg.algorithm.needs_critic:
            self.critic, _, _ = start_megatron_group(cfg, "critic", colocated=self.colocated, actor=self.actor,
                                                     actor_step=step)
        self._set(self.actor, self.critic)
        return step, state

    def _set(self, actor: MegatronGroup | None, critic: MegatronGroup | None) -> None:
        self.actor, self.critic = actor, critic
        self.turns.groups = tuple(g for g in (actor, critic) if g is not None)

    def shutdown_lost(self) -> None:
        """Both groups gone (the one that failed already is; the other is restarted with it, to load the
        same checkpoint step). --colocate: the actor's placement group stays, the engines live in it; the
        new actor adopts it (restart)."""
        self._kept_placement = self.actor.placement_group if self.colocated and self.actor is not None else None
        for group in (self.critic, self.actor):
            if group is not None:
                try:
                    group.shutdown(keep_placement=self.colocated)
                except Exception as error:  # noqa: BLE001 - ranks on a lost node cannot confirm their end
                    logger.warning("trainer heal: shutdown of the old %s group: %s", group.role, error)
        self._set(None, None)

    def restart(self, heal_from: str | None, actor_step: int, start_timeout_s: float,
                started: Callable[[MegatronGroup, int], None] | None = None) -> tuple[int, dict | None]:
        """The actor (and critic) started again from checkpoint root `heal_from` at `actor_step` (None: from
        what the run started from); `started(actor, step)` is called before they become the run's (the
        weight sync rebuilt on the new ranks), and a failure there shuts them down. Returns (step, extra
        state of that checkpoint)."""
        cfg = self.cfg
        actor, step, state = start_megatron_group(cfg, "actor", colocated=self.colocated, heal_from=heal_from,
                                                  actor_step=actor_step, placement_group=self._kept_placement,
                                                  start_timeout_s=start_timeout_s)
        self._kept_placement = None  # the new group's now: its shutdown removes it
        critic = None
        try:
            if cfg.algorithm.needs_critic:
                critic, _, _ = start_megatron_group(cfg, "critic", colocated=self.colocated, actor=actor,
                                                    actor_step=step,
                                                    heal_from=cfg.train.checkpoint.critic_save_dir if heal_from else None,
                                                    start_timeout_s=start_timeout_s)
            if started is not None:
                started(actor, step)
        except BaseException:
            for group in (critic, actor):
                if group is not None:
                    group.shutdown(keep_placement=self.colocated)
            self._kept_placement = actor.placement_group if self.colocated else None
            raise
        self._set(actor, critic)
        return step, state
