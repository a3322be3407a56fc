"""The trainer ranks' side of a weight sync; one RankWeightSync lives in each Megatron rank actor
(attached by sync.py: MegatronGroup.attach(RankWeightSync)) and the driver (sync.py, and the driver
half of each transport) calls its methods by reference (MegatronGroup.call_all(RankWeightSync.send_stage, ...))
on every rank in lockstep, one pipeline stage at a time. What differs between transports is their
rank half (transports/*.py), which RankSync hands each call to; it reads the weights through the
rank's public accessors (named_hf_tensors, named_hf_adapter_tensors, weight_dtypes).

Who sends: each pipeline stage sends its own tensors, from its lead rank (TP rank 0, DP rank 0);
the other ranks of the stage only take part in the TP/EP all-gathers of
export.iter_stage_hf_tensors. Nothing crosses stages, so no rank ever holds more than its stage's
tensors plus one bucket, and with PP no bytes travel twice (through a first-stage rank) on their way
to the engines. Stages send one after another: an SGLang scheduler handles one weight call at a time,
so two stages sending at once could each wait for engines busy with the other stage's call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lean_rl.weight_sync.engine_params import EngineChecksums
from lean_rl.weight_sync.errors import WeightSyncError
# the plan and the stages' reports live in a leaf the transports import too (stages.py)
from lean_rl.weight_sync.stages import RankSyncPlan, StageSent, TimedExport, in_dtype

if TYPE_CHECKING:
    from lean_rl.weight_sync.transports.base import Transport


class RankWeightSync:
    """Every weight sync of one rank, by id (RankSyncPlan.group_prefix), so that several WeightSyncs
    (e.g. distributed for training, disk for evaluation) can share one actor group."""

    def __init__(self, worker):
        self.worker = worker  # the hosting backends.megatron.rank.MegatronRank
        self.syncs: dict[str, RankSync] = {}

    def setup(self, plan: RankSyncPlan) -> dict:
        self.close(plan.group_prefix)
        self.syncs[plan.group_prefix] = sync = RankSync(self.worker, plan)
        return sync.setup()

    def connect_stage(self, sync_id: str, stage: int) -> None:
        return self._sync(sync_id).connect_stage(stage)

    def send_stage(self, sync_id: str, stage: int, *args) -> StageSent | None:
        """`args`: what the sync's transport sends a stage with (its driver half's deliver says)."""
        return self._sync(sync_id).send_stage(stage, *args)

    def stage_checksums(self, sync_id: str, stage: int):
        return self._sync(sync_id).stage_checksums(stage)

    def close(self, sync_id: str | None = None) -> None:
        """Close one sync (or all of them: None)."""
        for key in [sync_id] if sync_id is not None else list(self.syncs):
            sync = self.syncs.pop(key, None)
            if sync is not None:
                sync.close()

    def _sync(self, sync_id: str) -> RankSync:
        if sync_id not in self.syncs:
            raise WeightSyncError(f"rank {self.worker.rank}: no weight sync {sync_id!r} (set up, or closed already)")
        return self.syncs[sync_id]


class RankSync:
    """One weight sync on one rank: its plan, which ranks export and lead each stage, and the rank
    half of its transport (plan.transport), which holds the engine clients, process group..."""

    def __init__(self, worker, plan: RankSyncPlan):
        self.worker = worker  # MegatronRank: layout, config, device, named_hf_tensors
        self.plan = plan
        self.transport: Transport = plan.transport()

    # -- roles -------------------------------------------------------------------------------------
    @property
    def _layout(self):
        return self.worker.layout

    def is_lead(self, stage: int) -> bool:
        layout = self._layout
        return layout.pipeline_rank == stage and layout.tensor_rank == 0 and layout.data_rank == 0

    @property
    def leads_own_stage(self) -> bool:
        """This rank sends its pipeline stage to the engines."""
        return self.is_lead(self._layout.pipeline_rank)

    def _exports(self, stage: int) -> bool:
        """Takes part in gathering `stage`'s tensors. With EP the expert all-gathers span DP ranks, so
        all ranks of the stage do; otherwise DP replicas other than 0 have nothing to add."""
        layout, parallel = self._layout, self.worker.config.parallel
        return layout.pipeline_rank == stage and (layout.data_rank == 0 or parallel.expert_model_parallel_size > 1)

    def _stage_tensors(self):
        if self.plan.transport.sends_adapter:  # the LoRA adapters only (transports/adapter.py)
            tensors = self.worker.named_hf_adapter_tensors(self.plan.family)
        else:
            tensors = self.worker.named_hf_tensors(self.plan.family)
        return in_dtype(tensors, self.plan.dtype)

    # -- lockstep methods (called on every rank) ----------------------------------------------------
    def setup(self) -> dict:
        self.transport.setup_rank(self)
        stage = self._layout.pipeline_rank
        return {"rank": self.worker.rank, "stage": stage, "lead": self.is_lead(stage),
                "dtypes": self.worker.weight_dtypes()}

    def connect_stage(self, stage: int) -> None:
        if self.is_lead(stage):
            self.transport.connect_stage(self, stage)

    def send_stage(self, stage: int, *args) -> StageSent | None:
        """The transport sends `stage`'s tensors from its lead (StageSent there, None elsewhere)."""
        if not self._exports(stage):
            return None
        tensors = self._stage_tensors()
        if not self.is_lead(stage):
            for _ in tensors:  # take part in the all-gathers; the lead sends
                pass
            return None
        return self.transport.send_stage(self, TimedExport(stage, tensors), *args)

    def stage_checksums(self, stage: int) -> tuple[dict[str, str], dict[str, list[str]]] | None:
        """The hashes SGLang's /weights_checker would report for this stage's tensors (engine TP 1), and
        which HF tensors make up each engine parameter. On the lead of `stage`; None elsewhere."""
        if not self._exports(stage):
            return None
        checksums = EngineChecksums(self.worker.config.arch.num_experts)
        for name, tensor in self._stage_tensors():
            if self.is_lead(stage):
                checksums.add(name, tensor)
        if not self.is_lead(stage):
            return None
        if checksums.incomplete():
            # an expert parameter fuses experts from several stages' tensors: cannot happen (experts
            # of one layer live in one stage), so this means the name table no longer fits the model
            raise WeightSyncError(f"stage {stage}: engine parameters with missing parts: {checksums.incomplete()}")
        return checksums.checksums, checksums.sources

    def close(self) -> None:
        self.transport.close_rank(self)
