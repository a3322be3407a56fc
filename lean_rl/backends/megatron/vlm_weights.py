"""HF <-> VisionLanguageModel weights: the language model through its text family's weight table
(families.py, any TP / PP layout, as for a text model), the vision tower under the checkpoint's own names
(`visual.<name>` is the tower module's `<name>`: it is transformers' class, replicated, never sharded)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
from megatron.core import parallel_state

from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.hf_weights.binding import bind_params
from lean_rl.backends.megatron.hf_weights.checkpoint import HFCheckpoint
from lean_rl.backends.megatron.hf_weights.export import (gather_stage_tensors, iter_stage_hf_adapter_tensors,
                                                        iter_stage_hf_tensors)
from lean_rl.backends.megatron.hf_weights.families import geometry, weight_rules
from lean_rl.backends.megatron.hf_weights.layouts import to_megatron_shard
from lean_rl.backends.megatron.vlm_family import vlm_family
from lean_rl.backends.megatron.vlm_model import VisionLanguageModel


def vision_hf_names(model: VisionLanguageModel) -> dict[str, str]:
    """Tower parameter name -> HF tensor name (empty on stages without the tower)."""
    if model.vision_model is None:
        return {}
    prefix = vlm_family(model.hf_config).vision_prefix
    return {name: prefix + name for name, _ in model.vision_model.named_parameters()}


def load_vlm_weights(model: VisionLanguageModel, checkpoint_dir: str | Path, config: MegatronConfig) -> int:
    """Copy the checkpoint into this rank's parameters; returns the number of elements loaded. A tensor
    the model needs and the checkpoint lacks, or of another shape, is an error naming it."""
    family = vlm_family(model.hf_config)
    bound = bind_params(model.language_model, weight_rules(family.text_family, config.arch))
    geo = geometry(config)
    tp = (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size())
    loaded = 0
    with HFCheckpoint(checkpoint_dir) as checkpoint, torch.no_grad():
        for item in bound:
            shard = to_megatron_shard(item.rule.layout, [checkpoint.get(n) for n in item.hf_names], *tp, geo)
            loaded += _copy(item.param, shard, f"{item.name} (from {', '.join(item.hf_names)})")
        if model.vision_model is not None:
            params = dict(model.vision_model.named_parameters())
            for name, hf_name in vision_hf_names(model).items():
                loaded += _copy(params[name], checkpoint.get(hf_name)[:], hf_name)
    return loaded


def _copy(param: torch.Tensor, value: torch.Tensor, what: str) -> int:
    if tuple(value.shape) != tuple(param.shape):
        raise ValueError(f"{what}: checkpoint tensor is {tuple(value.shape)}, the model's {tuple(param.shape)}")
    param.copy_(value.to(dtype=param.dtype))
    return value.numel()


def iter_stage_vlm_hf_tensors(model: VisionLanguageModel, config: MegatronConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) of this stage: the vision tower (first stage), then the language model's
    (gathered over TP; collective within the stage's TP group, like iter_stage_hf_tensors)."""
    if model.vision_model is not None:
        params = dict(model.vision_model.named_parameters())
        for name, hf_name in vision_hf_names(model).items():
            yield hf_name, params[name].detach()
    yield from iter_stage_hf_tensors(model.language_model, config, vlm_family(model.hf_config).text_family)


def iter_stage_vlm_hf_adapter_tensors(model: VisionLanguageModel,
                                      config: MegatronConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, tensor) of the language model's LoRA adapters (--lora-rank adapts the language model
    only, lora.add_adapters): its HF names are its text family's, as in iter_stage_vlm_hf_tensors."""
    yield from iter_stage_hf_adapter_tensors(model.language_model, config, vlm_family(model.hf_config).text_family)


def gather_vlm_hf_state_dict(model: VisionLanguageModel, config: MegatronConfig,
                             dst: int = 0) -> dict[str, torch.Tensor] | None:
    """Every HF tensor of the model on global rank `dst` (None elsewhere). Collective over the world."""
    return gather_stage_tensors(iter_stage_vlm_hf_tensors(model, config), dst)
