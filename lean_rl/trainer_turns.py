"""Who holds the devices. Colocated on GPU the trainer and the engines take turns: the engines release
their memory while the trainer trains and syncs, and the trainer is offloaded while they generate
(EngineWeights.trainer_turn, after_send). Elsewhere nothing changes hands, and every method here is a
no-op but the weight-sync lock of `changing`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.health import EngineMonitor
    from lean_rl.weight_sync.engine_weights import EngineWeights


class TrainerTurns:
    def __init__(self, releases_memory: bool, colocate: bool):
        self.releases_memory = releases_memory  # cfg.engines.releases_memory: colocated on GPU
        self.colocate = colocate  # --colocate: the engines' /health fails by design while the trainer trains
        # set by the Runtime as they start: the actor and the critic, the weight sync, the health monitor
        self.groups: tuple[MegatronGroup, ...] = ()
        self.weight_sync: EngineWeights | None = None
        self.monitor: EngineMonitor | None = None
        self._inside = False

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Train and sync inside this block; colocated on GPU the devices are the trainer's until the
        sync gives the engines back their KV cache (health checks held, engines released, trainer
        onloaded; the sync offloads it again)."""
        if not self.releases_memory or self.weight_sync is None or not self.groups or self._inside:
            yield
            return
        self._inside = True
        try:
            with self.weight_sync.trainer_turn(self.onload):
                yield
        finally:
            self._inside = False

    @contextlib.contextmanager
    def changing(self, version: int) -> Iterator[None]:
        """No engine is given the trainer's weights halfway through a step; colocated, the engines have
        released their memory for training: /health fails by design then."""
        changing = self.weight_sync.trainer_changing(version) if self.weight_sync else contextlib.nullcontext()
        held = self.monitor.hold_health_checks() if self.monitor and self.colocate else contextlib.nullcontext()
        with changing, held:
            yield

    def before_engines_start(self) -> None:
        """Engines started after the trainer (--colocate): SGLang sizes its KV pool once, from the memory
        free when it starts, so colocated on GPU the trainer leaves the devices first, as slime starts its
        engines (review 2026-12-06 N5)."""
        if self.releases_memory:
            self.offload()

    def offload(self) -> None:
        """Free the trainers' device memory while the engines generate (no-op on CPU)."""
        for group in self.groups:
            group.offload()

    def onload(self) -> None:
        for group in self.groups:
            group.onload()
