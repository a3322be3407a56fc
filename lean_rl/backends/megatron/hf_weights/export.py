"""Gather this model's TP / EP shards back into full HF-named tensors (the inverse of load.py).
Collective: every rank must call these together (they all-gather within the TP, expert-TP and EP
groups, whose members always hold the same parameter structure)."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.hf_weights.binding import BoundParam, bind_params, unwrap_model
from lean_rl.backends.megatron.hf_weights.families import geometry, weight_rules
from lean_rl.backends.megatron.hf_weights.layouts import Layout, to_hf_tensors
from lean_rl.backends.megatron.lora import adapter_of, export_weight, peft_tensor_name


def _all_gather(tensor: torch.Tensor, group) -> list[torch.Tensor]:
    size = dist.get_world_size(group)
    if size == 1:
        return [tensor]
    out = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return out


def iter_stage_hf_tensors(model: torch.nn.Module, config: MegatronConfig,
                          family: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every HF tensor held by this rank's pipeline stage, in a fixed order.
    Every rank of the stage yields the same tensors."""
    geo = geometry(config)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    etp_group = parallel_state.get_expert_tensor_parallel_group()
    ep_group = parallel_state.get_expert_model_parallel_group()
    ep_size = parallel_state.get_expert_model_parallel_world_size()
    bound = bind_params(model, weight_rules(family, config.arch))
    with torch.no_grad():
        for item in bound:
            if not item.rule.exported:
                continue
            local = export_weight(unwrap_model(model), item.name, item.param)  # W + scaling B A under LoRA
            if item.rule.layout is Layout.REPLICATED:
                shards = [local]
            else:
                shards = _all_gather(local, etp_group if item.rule.per_expert else tp_group)
            tensors = to_hf_tensors(item.rule.layout, shards, geo)
            if not item.rule.per_expert:
                yield from zip(item.hf_names, tensors)
                continue
            yield from _experts_over_ep(item, tensors, ep_group, ep_size, config.arch.num_experts // ep_size)


def iter_stage_hf_adapter_tensors(model: torch.nn.Module, config: MegatronConfig,
                                  family: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, full tensor) for the lora_A and lora_B of every HF weight this stage adapts, for
    engines that serve the base with the adapter loaded apart (--lora-sync adapter). Collective within
    the stage's TP group, like iter_stage_hf_tensors. B's rows are the rows of the layer's weight, so
    the weight's own layout gathers and splits a fused B (linear_qkv -> q, k, v; linear_fc1 -> gate,
    up), whose parts share the fused layer's A (B_q A x is q's update); a row-parallel layer's A holds
    the weight's columns, split over TP as they are (lora.LoraAdapter)."""
    geo = geometry(config)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    unwrapped = unwrap_model(model)
    with torch.no_grad():
        for item in bind_params(model, weight_rules(family, config.arch)):
            adapter = adapter_of(unwrapped, item.name)
            if adapter is None:
                continue
            a, b = adapter.a.detach(), adapter.b.detach()
            if adapter.row_parallel:
                b_parts = to_hf_tensors(Layout.REPLICATED, [b], geo)
                a_parts = to_hf_tensors(Layout.ROW, _all_gather(a, tp_group), geo)
            else:
                b_parts = to_hf_tensors(item.rule.layout, _all_gather(b, tp_group), geo)
                a_parts = (a,) * len(b_parts)
            for hf_name, a_part, b_part in zip(item.hf_names, a_parts, b_parts):
                yield peft_tensor_name(hf_name, "A"), a_part
                yield peft_tensor_name(hf_name, "B"), b_part


def _experts_over_ep(item: BoundParam, tensors: tuple[torch.Tensor, ...], ep_group, ep_size: int,
                     num_local_experts: int) -> Iterator[tuple[str, torch.Tensor]]:
    # EP rank r holds global experts r * num_local + j (megatron moe_layer.py:103), and every EP rank
    # visits its local expert j at the same time, so gathering over EP yields experts j, n + j, ...
    gathered = [_all_gather(t, ep_group) for t in tensors]
    for ep_rank in range(ep_size):
        expert = ep_rank * num_local_experts + item.local_expert
        names = item.rule.hf_names(item.layer, expert)
        yield from zip(names, (per_rank[ep_rank] for per_rank in gathered))


def gather_hf_state_dict(model: torch.nn.Module, config: MegatronConfig, family: str,
                         dst: int = 0) -> dict[str, torch.Tensor] | None:
    """All HF tensors of the model, on global rank `dst` (None elsewhere). Collective over the world.
    Meant for tests and conversion; weight sync streams iter_stage_hf_tensors per stage instead."""
    return gather_stage_tensors(iter_stage_hf_tensors(model, config, family), dst)


def gather_stage_tensors(tensors: Iterator[tuple[str, torch.Tensor]], dst: int = 0) -> dict[str, torch.Tensor] | None:
    """Each pipeline stage's (name, tensor) pairs (read on TP rank 0 of DP rank 0) merged on global rank `dst`
    (None elsewhere); a name from two stages is an error. Collective over the world: every rank iterates."""
    contributes = (parallel_state.get_tensor_model_parallel_rank() == 0
                   and parallel_state.get_data_parallel_rank() == 0)
    stage = {name: t.cpu().clone() for name, t in tensors}
    parts: list | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(stage if contributes else None, parts, dst=dst)
    if parts is None:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, tensor in (part or {}).items():
            if name in merged:
                raise RuntimeError(f"{name} came from two pipeline stages")
            merged[name] = tensor
    return merged
