"""--weight-sync-transport distributed: each pipeline stage's lead rank is rank 0 of a process group
of its own with every engine's TP ranks (per-stage groups, as slime does; gloo on CPU, NCCL on GPU)
and broadcasts its buckets, while the engines' /update_weights_from_distributed calls for that
bucket are in flight. The engines join one group at a time, so connect goes stage by stage.

Pipelined from the second sync on: a stage's tensors (names, dtypes, shapes, bucket by bucket) are the
same at every sync of one model, so the lead remembers them from its first sync and, at the next ones,
posts each bucket's engine call before exporting the bucket, then broadcasts each tensor as soon as
it is exported: the export (TP/EP all-gathers, layout copies) overlaps the transfer instead of
preceding it (process_group.BroadcastStream)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, NamedTuple

import torch

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.utils.net import service_host
from lean_rl.weight_sync.buckets import Bucket
from lean_rl.weight_sync.engine_calls import call_all, submit_all, wait_all
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.process_group import (BroadcastStream, abort_group, broadcast_to_engines,
                                               join_as_rank_zero, open_group_store)
from lean_rl.weight_sync.transports.streamed import StreamedTransport

if TYPE_CHECKING:
    from lean_rl.weight_sync.stages import StageSent, TimedExport
    from lean_rl.weight_sync.transports.base import RankSide, SyncDriver


class TensorSpec(NamedTuple):
    name: str
    dtype: str
    shape: list[int]


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape))


class DistributedTransport(StreamedTransport):
    name = "distributed"

    def __init__(self):
        super().__init__()
        self.groups_joined = 0  # driver half: stages whose group every engine has joined
        self.group = None  # rank half, on a stage lead: its process group with the engines
        self.broken = False  # rank half: the group lost an engine mid-broadcast (see after_failed_send)
        self._store = None  # rank half: the engines' store clients stay connected to it for the group's lifetime
        # rank half, on a stage lead: per stage, its buckets' tensors as the last complete sync sent them
        self.layouts: dict[int, list[list[TensorSpec]]] = {}
        self._recording: list[list[TensorSpec]] | None = None

    # ------------------------------------------------------------------ driver half
    def check(self, trainer_device: str, engine_device: str) -> None:
        if engine_device != trainer_device:
            raise WeightSyncError(f"--weight-sync-transport distributed: the trainer is on {trainer_device}, "
                                  f"the engines on {engine_device}; one process group cannot span both")

    def connect(self, sync: SyncDriver) -> None:
        for stage in range(sync.num_stages):  # one stage at a time: an engine joins one group at a time
            sync.connect_stage(stage)
            self.groups_joined += 1

    def close(self, sync: SyncDriver) -> list[str]:
        problems = []
        for stage in range(self.groups_joined):
            try:
                call_all(sync.clients, sync.cfg.timeout_s, EngineClient.destroy_weights_update_group,
                         sync.plan.group_name(stage))
            except WeightSyncError as exc:
                problems.append(str(exc))
        self.groups_joined = 0
        return problems

    # ------------------------------------------------------------------ rank half
    def connect_stage(self, rank: RankSide, stage: int) -> None:
        """Open a store, ask every engine to join this stage's group, join it as rank 0."""
        plan = rank.plan
        world_size = 1 + sum(plan.engine_tp_sizes)
        host = service_host(rank.worker.on_cluster)  # this lead's address; the engines dial it
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
            raise WeightSyncError(f"rank {rank.worker.rank}: joining {plan.group_name(stage)} failed: {exc}") from exc
        wait_all(calls, plan.timeout_s, "init_weights_update_group")
        self._store = store

    def stream_stage(self, rank: RankSide, export: TimedExport, version: str, final_stage: bool) -> StageSent:
        layout = self.layouts.pop(export.stage, None)  # put back only by a sync that went through
        if layout is not None:
            sent = self._send_pipelined(rank, export, version, final_stage, layout)
            if sent.error is None:
                self.layouts[export.stage] = layout
            return sent
        self._recording = []
        try:
            sent = super().stream_stage(rank, export, version, final_stage)
            if sent.error is None:
                self.layouts[export.stage] = self._recording
            return sent
        finally:
            self._recording = None

    def send_bucket(self, rank: RankSide, bucket: Bucket, stage: int, version: str | None, final: bool) -> None:
        # One broadcast per tensor, straight from the exported tensors: SGLang's per-tensor receive
        # (load_format None) costs the engine nothing more than the flattened one, and the trainer
        # saves copying the bucket into one flat buffer (measured: the copy was ~30% of a base100m sync).
        plan = rank.plan
        tensors = [t.contiguous() for t in bucket.tensors]
        calls = self._post_bucket(rank, stage, [spec_of(n, t) for n, t in zip(bucket.names, tensors)], version, final)
        what = f"update_weights_from_distributed (stage {stage}, {len(bucket.names)} tensors)"
        broadcast_to_engines(self.group, tensors, calls, plan.timeout_s, what)
        wait_all(calls, plan.timeout_s, what)
        if self._recording is not None:
            self._recording.append([spec_of(n, t) for n, t in zip(bucket.names, tensors)])

    def _post_bucket(self, rank: RankSide, stage: int, specs: list[TensorSpec], version: str | None, final: bool):
        plan = rank.plan
        return submit_all(self.clients, EngineClient.update_weights_from_distributed, [s.name for s in specs],
                          [s.dtype for s in specs], [s.shape for s in specs], group_name=plan.group_name(stage),
                          weight_version=version, flush_cache=final, timeout_s=plan.timeout_s, in_open_session=True)

    def _send_pipelined(self, rank: RankSide, export: TimedExport, version: str, final_stage: bool,
                        layout: list[list[TensorSpec]]) -> StageSent:
        """The stage as the last sync sent it: each bucket's engine call posted first, each tensor
        broadcast as soon as it is exported. Exported tensors that differ from the layout (which a
        fixed model cannot cause) fail the sync; the engines still receive a tensor of the announced
        shape each (zeros), so that their calls end and the group stays usable."""
        plan = rank.plan
        total = count = 0
        # export ahead while the session's begin is in flight, at most the first bucket (its memory)
        assert self.session is not None, "send_stage on a rank that does not lead its stage"
        ahead: list = []
        first_bucket = len(layout[0]) if layout else 0
        while not self.session.answered() and len(ahead) < first_bucket:
            item = next(export, None)
            if item is None:
                break
            ahead.append(item)
        error = self.session_error()
        items = itertools.chain(ahead, export)
        for index, specs in enumerate(layout if error is None else []):
            final = final_stage and index == len(layout) - 1
            what = f"update_weights_from_distributed (stage {export.stage}, {len(specs)} tensors)"
            try:
                assert self.group is not None, "send_stage before connect_stage"
                calls = self._post_bucket(rank, export.stage, specs, version if final else None, final)
                stream = BroadcastStream(self.group, calls, plan.timeout_s, what)
                for spec in specs:
                    item = next(items, None)
                    found = None if item is None else spec_of(*item)
                    if item is not None and found == spec:
                        tensor = item[1]
                    else:
                        error = error or f"the stage's tensors changed since its last sync: expected {spec}, got {found}"
                        tensor = torch.zeros(spec.shape, dtype=getattr(torch, spec.dtype), device=rank.worker.device)
                    total, count = total + tensor.numel() * tensor.element_size(), count + 1
                    stream.send(tensor.contiguous())
                stream.finish()
                wait_all(calls, plan.timeout_s, what)
            except Exception as exc:  # noqa: BLE001 - an engine's fault must not end the trainer group
                error = f"{type(exc).__name__}: {exc}"
                self.after_failed_send()
            if error is not None:
                break
        for name, _ in items:  # export to the end: the TP/EP peers' all-gathers
            if error is None:
                error = f"the stage's tensors changed since its last sync: {name} is not in its layout"
        return export.sent(total, len(layout), count, error=error)

    def after_failed_send(self) -> None:
        self.broken = True  # its broadcasts may stay pending
        abort_group(self.group)

    def close_rank(self, rank: RankSide) -> None:
        import torch.distributed as dist

        if self.group is not None and not self.broken:
            dist.destroy_process_group(self.group)
        self.group = None  # a broken group (a peer engine died mid-broadcast) is dropped, not destroyed:
        self.broken = False  # destroying it could wait on its pending broadcasts
        self._store = None
        self.layouts = {}
        super().close_rank(rank)
