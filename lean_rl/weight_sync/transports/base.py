"""What a weight-sync transport is: one class that carries the trainer's weights to the engines,
with both of its halves in one place, so that a new transport is one new class in one file.

- The driver half runs in the driver, one instance per WeightSync (sync.py builds it from
  cfg.transport through transports.transport_for): `check` the devices, `connect` what must exist
  before the first delivery, `deliver` one version, `close` what connect opened.
- The rank half runs on every trainer rank, one instance per weight sync (rank.py RankSync builds it
  from the class that travels in RankSyncPlan.transport): `setup_rank`, `connect_stage` (on a stage's
  lead), `send_stage` (on a stage's lead, given the stage's exported tensors), `close_rank`.

The driver half reaches the rank half only through RankWeightSync's methods, called by reference
(WeightSync.connect_stage, WeightSync.send_stages): the rank resolves them to its hosted
RankWeightSync, which hands them to this sync's transport. Each half keeps its own state on its own
instance (an instance plays one half only). What each half uses of its side is declared here
(SyncDriver: sync.WeightSync; RankSide: rank.RankSync), so that a transport imports neither.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.stages import EngineInfo, RankSyncPlan, StageSent, TimedExport


class SyncDriver(Protocol):
    """The driver's side of one weight sync, as a transport's driver half uses it (sync.WeightSync)."""
    cfg: WeightSyncConfig
    plan: RankSyncPlan | None  # set once connected
    clients: list[BlockingEngineClient]
    engines: tuple[EngineInfo, ...]

    @property
    def num_stages(self) -> int: ...

    def send_stages(self, args_for_stage: Callable[[int], tuple]) -> list[StageSent]: ...

    def connect_stage(self, stage: int) -> None: ...


class RankSide(Protocol):
    """One rank's side of one weight sync, as a transport's rank half uses it (rank.RankSync)."""
    plan: RankSyncPlan
    worker: Any  # the MegatronRank: its rank, device, on_cluster

    @property
    def leads_own_stage(self) -> bool: ...


class Transport(ABC):
    name: ClassVar[str]  # its --weight-sync-transport value (config.TRANSPORTS); SyncReport.transport
    # what the ranks export for it: the full HF weights (LoRA merged in), or only the LoRA adapters
    sends_adapter: ClassVar[bool] = False

    # ------------------------------------------------------------------ driver half
    def check(self, trainer_device: str, engine_device: str) -> None:
        """Raise WeightSyncError when this transport cannot carry weights from a trainer on
        `trainer_device` to engines on `engine_device` ("cpu", "cuda")."""

    def connect(self, sync: SyncDriver) -> None:
        """After every rank's setup_rank: what must exist before the first delivery."""

    @abstractmethod
    def deliver(self, sync: SyncDriver, version: str) -> list[StageSent]:
        """Every engine holds the trainer's weights as `version` (weight_version set, prefix cache
        flushed) on return; one StageSent per pipeline stage."""

    def close(self, sync: SyncDriver) -> list[str]:
        """Undo connect, best effort (the trainer or an engine may be gone): the problems met, which
        WeightSync.close logs. Called once the engine clients may be used no more than for that."""
        return []

    # ------------------------------------------------------------------ rank half
    def setup_rank(self, rank: RankSide) -> None:
        """On every rank, once per weight sync, with rank.plan set."""

    def connect_stage(self, rank: RankSide, stage: int) -> None:
        """On the lead rank of `stage` only (connect asks for it, one stage at a time)."""

    @abstractmethod
    def send_stage(self, rank: RankSide, export: TimedExport, *args) -> StageSent:
        """On the lead rank of `export.stage` only: send the stage's tensors (iterate `export`; its
        TP/EP peers take part in the same all-gathers meanwhile). `args`: what this transport's
        deliver gave WeightSync.send_stages for the stage. An engine's failure is reported in
        StageSent.error, not raised, after exporting to the end (the peers' all-gathers complete)."""

    def close_rank(self, rank: RankSide) -> None:
        """Undo setup_rank and connect_stage; must not wait on a broken peer."""
