"""The trainer ranks' side of a weight sync; one RankWeightSync lives in each Megatron rank actor
(attached by sync.py: MegatronGroup.attach(RankWeightSync)) and the driver (sync.py) calls its methods
by reference (MegatronGroup.call_all(RankWeightSync.send_stage, ...)) on every rank in lockstep, one pipeline stage at a time. It reads
the weights through the rank's public accessors (named_hf_tensors, weight_dtypes).

Who sends: each pipeline stage sends its own tensors, from its lead rank (TP rank 0, DP rank 0);
the other ranks of the stage only take part in the TP/EP all-gathers of
export.iter_stage_hf_tensors. Nothing crosses stages, so no rank ever holds more than its stage's
tensors plus one bucket, and with PP no bytes travel twice (through a first-stage rank) on their way
to the engines. Stages send one after another: an SGLang scheduler handles one weight call at a time,
so two stages sending at once could each wait for engines busy with the other stage's call.
With --weight-sync-transport distributed each stage lead is rank 0 of its own process group with the engines
(per-stage groups, as slime does).
"""

from __future__ import annotations

import base64
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.utils.net import service_host
from lean_rl.weight_sync.buckets import Bucket, iter_buckets, standalone
from lean_rl.weight_sync.engine_calls import submit_all, wait_all
from lean_rl.weight_sync.engine_params import EngineChecksums
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.process_group import abort_group, broadcast_to_engines, join_as_rank_zero, open_group_store


@dataclass(frozen=True)
class RankSyncPlan:
    """What every rank needs to know; sent once, at connect."""

    transport: str  # distributed | tensor | disk
    engine_urls: tuple[str, ...]
    engine_tp_sizes: tuple[int, ...]
    buffer_size_bytes: int
    timeout_s: float
    family: str
    group_prefix: str  # unique per WeightSync: process-group names are global in a process
    backend: str  # gloo (CPU) | nccl (GPU)
    api_key: str | None = field(default=None, repr=False)  # the run's, which the engines require
    # the engines' dtype ("bfloat16", ...): tensors travel in it (SGLang would cast them on load
    # anyway), so a float32 trainer sends a 16-bit engine half the bytes, and the checksums after a
    # failed probe hash exactly the bytes the engine holds. None: the trainer's own dtypes.
    dtype: str | None = None

    def group_name(self, stage: int) -> str:
        return f"{self.group_prefix}_pp{stage}"


@dataclass(frozen=True)
class StageSent:
    stage: int
    bytes: int
    buckets: int
    tensors: int
    export_seconds: float  # gathering HF tensors from the Megatron shards (TP/EP all-gathers, layouts)
    send_seconds: float  # everything else on the lead: flatten / serialize / write, engine calls
    weight_map: dict[str, str] | None = None  # disk: HF name -> file name in the directory
    # An engine call or broadcast failed (an engine died or restarted): the lead went on exporting
    # without sending, so that its TP/EP peers' all-gathers complete and the trainer group lives on.
    error: str | None = None


class _TimedIterator:
    """Counts the seconds spent producing the items of `items` (the export), apart from the consumer."""

    def __init__(self, items):
        self._items = iter(items)
        self.seconds = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        started = time.perf_counter()
        try:
            return next(self._items)
        finally:
            self.seconds += time.perf_counter() - started


def cpu_tensor_payload(bucket: Bucket) -> str:
    """An inline payload for /update_weights_from_tensor: base64(pickle([(name, tensor), ...])). The
    tensor bytes travel inside it (SGLang's SafeUnpickler loads them with a safe torch.load). SGLang's
    own MultiprocessingSerializer would pass CPU tensors as file descriptors, which an unrelated
    server process cannot open: its scheduler dies (reference/sglang_cpu/REPORT.md, note 3)."""
    named = [(name, standalone(tensor.cpu())) for name, tensor in zip(bucket.names, bucket.tensors)]
    return base64.b64encode(pickle.dumps(named, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def cuda_ipc_bucket(bucket: Bucket) -> dict:
    """GPU: the bucket as one flat tensor on this rank's GPU plus SGLang's metadata, for load_format
    "flattened_bucket". Must stay alive until every engine has loaded it. Not exercised on the
    CPU-only machines this was written on."""
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    metadata, offset = [], 0
    for name, tensor in zip(bucket.names, bucket.tensors):
        size = tensor.numel() * tensor.element_size()
        metadata.append(FlattenedTensorMetadata(name=name, shape=tensor.shape, dtype=tensor.dtype,
                                                start_idx=offset, end_idx=offset + size, numel=size))
        offset += size
    return {"flattened_tensor": bucket.flatten(), "metadata": metadata}


def cuda_ipc_payloads(flat_bucket: dict, tp_size: int) -> list[str]:
    """One serialized set of CUDA IPC handles per engine TP rank (each rank must open its own copy:
    sglang/srt/managers/tp_worker.py deserialize_own_rank); no tensor bytes are copied. The process
    must have applied backends.sglang.compat.patch_torch_cuda_ipc_reductions (setup does)."""
    from sglang.srt.utils import MultiprocessingSerializer

    return [MultiprocessingSerializer.serialize(flat_bucket, output_str=True) for _ in range(tp_size)]


class RankWeightSync:
    """Every weight sync of one rank, by id (RankSyncPlan.group_prefix), so that several WeightSyncs
    (e.g. distributed for training, disk for evaluation) can share one actor group."""

    def __init__(self, worker):
        self.worker = worker  # the hosting backends.megatron.rank.MegatronRank
        self.syncs: dict[str, _RankSync] = {}

    def setup(self, plan: RankSyncPlan) -> dict:
        self.close(plan.group_prefix)
        self.syncs[plan.group_prefix] = sync = _RankSync(self.worker)
        return sync.setup(plan)

    def connect_stage(self, sync_id: str, stage: int) -> None:
        return self._sync(sync_id).connect_stage(stage)

    def send_stage(self, sync_id: str, stage: int, version: str, final_stage: bool) -> StageSent | None:
        return self._sync(sync_id).send_stage(stage, version, final_stage)

    def write_stage(self, sync_id: str, stage: int, directory: str) -> StageSent | None:
        return self._sync(sync_id).write_stage(stage, directory)

    def stage_checksums(self, sync_id: str, stage: int):
        return self._sync(sync_id).stage_checksums(stage)

    def close(self, sync_id: str | None = None) -> None:
        """Close one sync (or all of them: None)."""
        for key in [sync_id] if sync_id is not None else list(self.syncs):
            sync = self.syncs.pop(key, None)
            if sync is not None:
                sync.close()

    def _sync(self, sync_id: str) -> "_RankSync":
        if sync_id not in self.syncs:
            raise WeightSyncError(f"rank {self.worker.rank}: no weight sync {sync_id!r} (set up, or closed already)")
        return self.syncs[sync_id]


class _RankSync:
    """One weight sync's state on one rank: its plan, engine clients (stage leads), process group."""

    def __init__(self, worker):
        self.worker = worker  # MegatronRank: layout, config, device, named_hf_tensors
        self.plan: RankSyncPlan | None = None
        self.clients: list = []
        self.group = None
        self.broken = False  # the group lost an engine mid-broadcast (see send_stage)
        self._store = None

    # -- roles -------------------------------------------------------------------------------------
    @property
    def _layout(self):
        return self.worker.layout

    def _is_lead(self, stage: int) -> bool:
        layout = self._layout
        return layout.pipeline_rank == stage and layout.tensor_rank == 0 and layout.data_rank == 0

    def _exports(self, stage: int) -> bool:
        """Takes part in gathering `stage`'s tensors. With EP the expert all-gathers span DP ranks, so
        all ranks of the stage do; otherwise DP replicas other than 0 have nothing to add."""
        layout, parallel = self._layout, self.worker.config.parallel
        return layout.pipeline_rank == stage and (layout.data_rank == 0 or parallel.expert_model_parallel_size > 1)

    def _stage_tensors(self):
        tensors = self.worker.named_hf_tensors(self.plan.family)
        if self.plan.dtype is None:
            return tensors
        dtype = getattr(torch, self.plan.dtype)
        return ((name, tensor.to(dtype)) for name, tensor in tensors)

    def _require_plan(self) -> RankSyncPlan:
        if self.plan is None:
            raise WeightSyncError(f"rank {self.worker.rank}: weight sync not set up (call setup first)")
        return self.plan

    # -- lockstep methods (called on every rank) ----------------------------------------------------
    def setup(self, plan: RankSyncPlan) -> dict:
        from lean_rl.backends.sglang.client import BlockingEngineClient

        self.plan = plan
        stage = self._layout.pipeline_rank
        if self._is_lead(stage) and plan.transport != "disk":
            self.clients = [BlockingEngineClient(url, timeout_s=plan.timeout_s, api_key=plan.api_key)
                            for url in plan.engine_urls]
        if self._is_lead(stage) and plan.transport == "tensor" and self.worker.device.type == "cuda":
            from lean_rl.backends.sglang.compat import patch_torch_cuda_ipc_reductions

            patch_torch_cuda_ipc_reductions()  # once per process, before the first cuda_ipc_payloads
        return {"rank": self.worker.rank, "stage": stage, "lead": self._is_lead(stage),
                "dtypes": self.worker.weight_dtypes()}

    def connect_stage(self, stage: int) -> None:
        """distributed: the lead of `stage` opens a store, asks every engine to join its group, joins."""
        plan = self._require_plan()
        if not self._is_lead(stage):
            return
        world_size = 1 + sum(plan.engine_tp_sizes)
        host = service_host(self.worker.on_cluster)  # this lead's address; the engines dial it
        store, port = open_group_store(world_size, plan.timeout_s, host)
        offsets = [1 + sum(plan.engine_tp_sizes[:i]) for i in range(len(plan.engine_urls))]
        calls = [(client.base_url, client.submit(EngineClient.init_weights_update_group, host, port, offset,
                                                 world_size, group_name=plan.group_name(stage),
                                                 backend=plan.backend, timeout_s=plan.timeout_s))
                 for client, offset in zip(self.clients, offsets)]
        try:
            self.group = join_as_rank_zero(store, world_size, plan.group_name(stage), plan.backend, plan.timeout_s)
        except Exception as exc:
            wait_all(calls, plan.timeout_s, "init_weights_update_group")  # an engine's own error says more
            raise WeightSyncError(f"rank {self.worker.rank}: joining {plan.group_name(stage)} failed: {exc}") from exc
        wait_all(calls, plan.timeout_s, "init_weights_update_group")
        self._store = store  # the engines' store clients stay connected to it for the group's lifetime

    def send_stage(self, stage: int, version: str, final_stage: bool) -> StageSent | None:
        """tensor / distributed: stream this stage's tensors to every engine, bucket by bucket, inside
        the weight-update session the driver opened. The stage's last bucket of the final stage sets
        the weight version and flushes the engines' prefix cache."""
        plan = self._require_plan()
        if not self._exports(stage):
            return None
        tensors = self._stage_tensors()
        if not self._is_lead(stage):
            for _ in tensors:  # take part in the all-gathers; the lead sends
                pass
            return None
        if plan.transport not in ("distributed", "tensor"):
            raise WeightSyncError(f"send_stage: transport {plan.transport!r} does not stream buckets")
        started, timed = time.perf_counter(), _TimedIterator(tensors)
        total = buckets = count = 0
        error = None
        for bucket, is_last in iter_buckets(timed, plan.buffer_size_bytes):
            final = final_stage and is_last
            if error is None:  # after a failure: keep exporting (the peers' all-gathers), send nothing
                try:
                    if plan.transport == "distributed":
                        self._broadcast_bucket(bucket, stage, version if final else None, final)
                    else:
                        self._post_tensor_bucket(bucket, version if final else None, final)
                except Exception as exc:  # noqa: BLE001 - an engine's fault must not end the trainer group
                    error = f"{type(exc).__name__}: {exc}"
                    if plan.transport == "distributed":  # its broadcasts may stay pending
                        self.broken = True
                        abort_group(self.group)
            total, buckets, count = total + bucket.nbytes, buckets + 1, count + len(bucket.names)
        return StageSent(stage, total, buckets, count, timed.seconds, time.perf_counter() - started - timed.seconds,
                         error=error)

    def write_stage(self, stage: int, directory: str) -> StageSent | None:
        """disk: this stage's tensors as safetensors files in `directory` (one file per bucket)."""
        from safetensors.torch import save_file

        plan = self._require_plan()
        if not self._exports(stage):
            return None
        tensors = self._stage_tensors()
        if not self._is_lead(stage):
            for _ in tensors:
                pass
            return None
        started, timed = time.perf_counter(), _TimedIterator(tensors)
        weight_map, total, count = {}, 0, 0
        for count, (bucket, _) in enumerate(iter_buckets(timed, plan.buffer_size_bytes), start=1):
            file_name = f"model-pp{stage:03d}-{count:05d}.safetensors"
            save_file({n: standalone(t.cpu()) for n, t in zip(bucket.names, bucket.tensors)},
                      str(Path(directory) / file_name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(bucket.names, file_name))
            total += bucket.nbytes
        return StageSent(stage, total, count, len(weight_map), timed.seconds,
                         time.perf_counter() - started - timed.seconds, weight_map)

    def stage_checksums(self, stage: int) -> tuple[dict[str, str], dict[str, list[str]]] | None:
        """The hashes SGLang's /weights_checker would report for this stage's tensors (engine TP 1), and
        which HF tensors make up each engine parameter. On the lead of `stage`; None elsewhere."""
        if not self._exports(stage):
            return None
        checksums = EngineChecksums(self.worker.config.arch.num_experts)
        for name, tensor in self._stage_tensors():
            if self._is_lead(stage):
                checksums.add(name, tensor)
        if not self._is_lead(stage):
            return None
        if checksums.incomplete():
            # an expert parameter fuses experts from several stages' tensors: cannot happen (experts
            # of one layer live in one stage), so this means the name table no longer fits the model
            raise WeightSyncError(f"stage {stage}: engine parameters with missing parts: {checksums.incomplete()}")
        return checksums.checksums, checksums.sources

    def close(self) -> None:
        import torch.distributed as dist

        if self.group is not None and not self.broken:
            dist.destroy_process_group(self.group)
        self.group = None  # a broken group (a peer engine died mid-broadcast) is dropped, not destroyed:
        self.broken = False  # destroying it could wait on its pending broadcasts
        self._store = None
        for client in self.clients:
            client.close()
        self.clients = []

    # -- one bucket ----------------------------------------------------------------------------------
    def _broadcast_bucket(self, bucket: Bucket, stage: int, version: str | None, final: bool) -> None:
        # One broadcast per tensor, straight from the exported tensors: SGLang's per-tensor receive
        # (load_format None) costs the engine nothing more than the flattened one, and the trainer
        # saves copying the bucket into one flat buffer (measured: the copy was ~30% of a base100m sync).
        plan = self.plan
        tensors = [t.contiguous() for t in bucket.tensors]
        calls = submit_all(self.clients, EngineClient.update_weights_from_distributed, bucket.names, bucket.dtype_names(),
                           bucket.shapes(), group_name=plan.group_name(stage), weight_version=version,
                           flush_cache=final, timeout_s=plan.timeout_s, in_open_session=True)
        what = f"update_weights_from_distributed (stage {stage}, {len(bucket.names)} tensors)"
        broadcast_to_engines(self.group, tensors, calls, plan.timeout_s, what)
        wait_all(calls, plan.timeout_s, what)

    def _post_tensor_bucket(self, bucket: Bucket, version: str | None, final: bool) -> None:
        plan = self.plan
        keep_alive = None
        update = EngineClient.update_weights_from_tensor
        if self.worker.device.type == "cuda":
            keep_alive = cuda_ipc_bucket(bucket)
            calls = [(client.base_url, client.submit(
                update, cuda_ipc_payloads(keep_alive, tp_size), weight_version=version, flush_cache=final,
                load_format="flattened_bucket", timeout_s=plan.timeout_s, in_open_session=True))
                for client, tp_size in zip(self.clients, plan.engine_tp_sizes)]
        else:
            payload = cpu_tensor_payload(bucket)
            calls = [(client.base_url, client.submit(
                update, [payload] * tp_size, weight_version=version, flush_cache=final,
                timeout_s=plan.timeout_s, in_open_session=True))
                for client, tp_size in zip(self.clients, plan.engine_tp_sizes)]
        wait_all(calls, plan.timeout_s, f"update_weights_from_tensor ({len(bucket.names)} tensors)")
        del keep_alive  # the engines have copied the bucket out of our GPU memory
