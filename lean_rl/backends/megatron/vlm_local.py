"""One Megatron rank of a vision-language model in this process (gloo on CPU, NCCL on CUDA): what the VLM
checkpoint converter runs (world size 1) and what the tests' spawned ranks run (any TP / PP)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from lean_rl.backends.megatron import compat
from lean_rl.backends.megatron.compat_cpu import megatron_thread_mode
from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.distributed import destroy_distributed, init_distributed
from lean_rl.backends.megatron.hf_config import load_hf_config
from lean_rl.backends.megatron.vlm_family import vlm_arch
from lean_rl.backends.megatron.vlm_model import VisionLanguageModel, build_vlm_model
from lean_rl.backends.megatron.vlm_weights import load_vlm_weights

Job = Callable[[VisionLanguageModel, MegatronConfig], Any]


def run_vlm_rank(job: Job, hf_dir: str | Path, *, rank: int = 0, world_size: int = 1, port: int = 0,
                 parallel: ParallelConfig = ParallelConfig(), divisible_by: int = 128, params_dtype: str = "float32",
                 load_hf: bool = True, freeze_vision_tower: bool = False, device: torch.device | None = None,
                 timeout_s: float = 300.0) -> Any:
    """Build this rank's VisionLanguageModel from `hf_dir`'s config (its weights too with load_hf) and
    return job(model, config). port 0 with world size 1: the store picks one."""
    device = device or torch.device("cpu")
    compat.apply_compat(device)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=timeout_s))
    with megatron_thread_mode(device):
        init_distributed(rank, world_size, store, parallel, device, seed=1234, timeout_s=timeout_s)
        try:
            hf_config = load_hf_config(hf_dir)
            config = MegatronConfig(arch=vlm_arch(hf_config, divisible_by), parallel=parallel,
                                    params_dtype=params_dtype)
            model = build_vlm_model(config, hf_config, device, freeze_vision_tower)
            if load_hf:
                load_vlm_weights(model, hf_dir, config)
            return job(model, config)
        finally:
            destroy_distributed()
