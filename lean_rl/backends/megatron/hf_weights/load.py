"""Load an HF safetensors checkpoint into this rank's GPTModel (any TP / PP / EP layout). Each rank
reads only the slices it owns. Called on every rank after parallel_state is initialised; no
collectives, so ranks may load at their own pace."""

from __future__ import annotations

from pathlib import Path

import torch
from megatron.core import parallel_state

from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.hf_config import check_arch_matches_checkpoint
from lean_rl.backends.megatron.hf_weights.binding import bind_params
from lean_rl.backends.megatron.hf_weights.checkpoint import HFCheckpoint
from lean_rl.backends.megatron.hf_weights.families import geometry, weight_rules
from lean_rl.backends.megatron.hf_weights.layouts import to_megatron_shard


def load_hf_weights(model: torch.nn.Module, checkpoint_dir: str | Path, config: MegatronConfig, family: str) -> int:
    """Copy the checkpoint into every parameter of `model`; returns the number of elements loaded."""
    check_arch_matches_checkpoint(config.arch, checkpoint_dir)
    bound = bind_params(model, weight_rules(family, config.arch))
    geo = geometry(config)
    tp = (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size())
    etp = (parallel_state.get_expert_tensor_parallel_rank(), parallel_state.get_expert_tensor_parallel_world_size())
    loaded = 0
    with HFCheckpoint(checkpoint_dir) as checkpoint, torch.no_grad():
        for item in bound:
            rank, size = etp if item.rule.per_expert else tp
            sources = [checkpoint.get(name) for name in item.hf_names]
            shard = to_megatron_shard(item.rule.layout, sources, rank, size, geo)
            if shard.shape != item.param.shape:
                raise ValueError(f"{item.name}: built a {tuple(shard.shape)} shard from {item.hf_names}, "
                                 f"the parameter is {tuple(item.param.shape)}")
            item.param.copy_(shard.to(dtype=item.param.dtype))
            loaded += shard.numel()
    return loaded
