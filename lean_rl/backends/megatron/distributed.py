"""torch.distributed + Megatron parallel_state for one rank. The backend follows the device (gloo on
CPU, NCCL on CUDA). The rendezvous store listens on one address only, rank 0's
utils.net.service_host (127.0.0.1 on one node, its node's Ray address on a cluster), and every rank
dials that address: torch's TCPStore binds every interface when it opens the port itself, so rank 0
binds the socket and hands TCPStore its fd."""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.utils.net import LOOPBACK


@dataclass(frozen=True)
class RankLayout:
    rank: int
    world_size: int
    tensor_rank: int
    pipeline_rank: int
    data_rank: int
    expert_rank: int
    is_first_stage: bool
    is_last_stage: bool


def open_rendezvous_store(world_size: int, timeout_s: float, host: str = LOOPBACK) -> tuple[dist.TCPStore, int]:
    """Rank 0: a TCPStore server on `host` only, on a port the OS picks; returns (store, port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(world_size * 4)
    port = sock.getsockname()[1]
    # TCPStore takes ownership of the fd (its server closes it), so detach it from the Python socket.
    store = dist.TCPStore(host, port, world_size, is_master=True,
                          timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                          master_listen_fd=sock.detach())
    return store, port


def connect_rendezvous_store(port: int, world_size: int, timeout_s: float, host: str = LOOPBACK) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def init_distributed(rank: int, world_size: int, store: dist.Store, parallel: ParallelConfig,
                     device: torch.device, seed: int, timeout_s: float) -> RankLayout:
    from megatron.core import parallel_state, tensor_parallel

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="gloo" if device.type == "cpu" else "nccl", store=store, rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    # Megatron's use_cpu_initialization draws weights from the default CPU generator, which this
    # torch build seeds differently in every process, and nothing broadcasts parameters: without
    # one seed everywhere, TP shards come from different master weights and DP replicas diverge.
    torch.manual_seed(seed)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        expert_tensor_parallel_size=parallel.expert_tensor_parallel_size,
        distributed_timeout_minutes=max(1, int(-(-timeout_s // 60))),
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return RankLayout(
        rank=rank,
        world_size=world_size,
        tensor_rank=parallel_state.get_tensor_model_parallel_rank(),
        pipeline_rank=parallel_state.get_pipeline_model_parallel_rank(),
        data_rank=parallel_state.get_data_parallel_rank(),
        expert_rank=parallel_state.get_expert_model_parallel_rank(),
        is_first_stage=parallel_state.is_pipeline_first_stage(),
        is_last_stage=parallel_state.is_pipeline_last_stage(),
    )


def destroy_distributed() -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
