"""--weight-sync-transport tensor: the stage leads post /update_weights_from_tensor per bucket. On GPU
the payload is CUDA IPC handles to the bucket on the lead's GPU (colocated engines open them; no
bytes are copied), on CPU an inline pickled payload that reaches any engine."""

from __future__ import annotations

import base64
import pickle
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.buckets import Bucket, standalone
from lean_rl.weight_sync.engine_calls import wait_all
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.transports.streamed import StreamedTransport

if TYPE_CHECKING:
    from lean_rl.weight_sync.transports.base import RankSide


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
    must have applied backends.sglang.compat.patch_torch_cuda_ipc_reductions (setup_rank does)."""
    from sglang.srt.utils import MultiprocessingSerializer

    return [MultiprocessingSerializer.serialize(flat_bucket, output_str=True) for _ in range(tp_size)]


class TensorTransport(StreamedTransport):
    name = "tensor"

    # ------------------------------------------------------------------ driver half
    def check(self, trainer_device: str, engine_device: str) -> None:
        if trainer_device == "cuda" and engine_device != "cuda":
            raise WeightSyncError("--weight-sync-transport tensor: CUDA IPC needs the engines on the GPU too")

    # ------------------------------------------------------------------ rank half
    def setup_rank(self, rank: RankSide) -> None:
        super().setup_rank(rank)
        if rank.leads_own_stage and rank.worker.device.type == "cuda":
            from lean_rl.backends.sglang.compat import patch_torch_cuda_ipc_reductions

            patch_torch_cuda_ipc_reductions()  # once per process, before the first cuda_ipc_payloads

    def send_bucket(self, rank: RankSide, bucket: Bucket, stage: int, version: str | None, final: bool) -> None:
        plan = rank.plan
        keep_alive = None
        update = EngineClient.update_weights_from_tensor
        if rank.worker.device.type == "cuda":
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
