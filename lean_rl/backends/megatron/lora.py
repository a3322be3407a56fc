"""LoRA (Hu et al. 2021, arXiv:2106.09685) on the actor's Megatron linear layers, rank side.

Megatron-core has no adapters of its own, and Megatron-Bridge's PEFT does not install beside our pins
(megatron-bridge 0.3.x requires transformers<5, transformer-engine[core_cu13]<2.13 and imports
transformer_engine at the top of its LoRA modules). So: a small adapter per targeted linear layer.

Each targeted ColumnParallelLinear / RowParallelLinear (the local layer spec) gets a child module
`lora` with A [r, in] (uniform in +-1/sqrt(in), the kaiming-uniform default of nn.Linear and PEFT) and
B [out, r] (zeros), and a forward hook that adds scaling * B A dropout(x) to the layer's output
(Megatron's linear returns (output, bias): the hook keeps that contract). Every other parameter is
frozen (requires_grad False), so Megatron's DDP gives only A and B gradient buffers and its optimizer
steps only them. B = 0 at the start: the adapted model computes exactly the base model.

Names keep the base weights where they were (`...linear_qkv.weight`), so HF loading, the weight
tables and checkpoints of the base are untouched; the adapters add `...linear_qkv.lora.a`, `.lora.b`
and `.lora.scaling` (a buffer: a checkpoint says with which alpha / rank its B was trained).
Checkpoints hold them: the linear's sharded_state_dict is replaced per layer by one that declares
the adapter's TP shard sharded (see LoraAdapter for how A and B split under TP).
Weight export (sync to the engines, gather_hf_state_dict) sends the merged W + scaling * B A under
the base names (`export_weight`), so SGLang, the probe and the tables see an ordinary model; with
--lora-sync adapter the engines serve the base with the adapters loaded apart, and a sync sends only
A and B under PEFT's names (hf_weights/export.iter_stage_hf_adapter_tensors).

A's initial values come from a generator seeded by (--seed, global layer, target), not from the
global RNG: every DP replica and every layout starts from the same adapters."""

from __future__ import annotations

import functools
import math
import re
from typing import cast

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                  set_tensor_model_parallel_attributes)
from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                    reduce_from_tensor_model_parallel_region)
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from lean_rl.backends.megatron.hf_weights.dist_keys import LORA_ADAPTER, merge_lora
from lean_rl.backends.megatron.lora_config import LORA_TARGETS, LoraConfig
from lean_rl.options import ConfigError

ADAPTER = LORA_ADAPTER  # the child module's name under an adapted linear layer
_TARGET = re.compile(r"decoder\.layers\.(?P<layer>\d+)\.(?:self_attention|mlp)\.(?P<target>linear_\w+)$")
_ATTENTION = ("linear_qkv", "linear_proj")


class LoraAdapter(torch.nn.Module):
    """The adapter of one linear layer on one TP rank. Under TP the adapter splits as its layer does:
    - column-parallel (linear_qkv, linear_fc1: output rows split): A [r, in] whole on every rank, B
      [out / tp, r] its rows' shard. h = A x is the same on every rank, and passes through
      copy_to_tensor_model_parallel_region before B (identity forward, all-reduce backward), so A's
      gradient sums every rank's B shard and stays identical across TP;
    - row-parallel (linear_proj, linear_fc2: input columns split, the output all-reduced): A [r, in / tp]
      its columns' shard applied to the rank's input shard, the partial h all-reduced
      (reduce_from_tensor_model_parallel_region), then B [out, r] whole on every rank.
    The shards carry Megatron's tensor_model_parallel attributes (gradient norm, clipping) and are
    saved as TP-sharded tensors (`axis_map`); the whole ones as replicated."""

    def __init__(self, in_features: int, out_features: int, rank: int, scaling: float, dropout: float,
                 generator: torch.Generator, like: torch.Tensor, row_parallel: bool = False,
                 tp: int = 1, tp_rank: int = 0):
        super().__init__()
        global_in = in_features * tp if row_parallel else in_features
        bound = 1.0 / math.sqrt(global_in)  # as for the unsplit layer: every layout starts from one A
        a = torch.empty(rank, global_in).uniform_(-bound, bound, generator=generator)
        if row_parallel:
            a = a[:, tp_rank * in_features:(tp_rank + 1) * in_features]
        self.a = torch.nn.Parameter(a.contiguous().to(device=like.device, dtype=like.dtype))
        self.b = torch.nn.Parameter(torch.zeros(out_features, rank, device=like.device, dtype=like.dtype))
        self.register_buffer("scaling", torch.tensor([scaling], dtype=torch.float32, device=like.device))
        self.configured_scaling = scaling  # the flags' (after_load checks a checkpoint's against it)
        self.dropout = torch.nn.Dropout(dropout)
        self.row_parallel, self.tp = row_parallel, tp
        self.gated_rows = False  # B's rows are a SwiGLU linear_fc1's [gate; up] (add_adapters sets it)
        sharded, dim = (self.a, 1) if row_parallel else (self.b, 0)
        set_tensor_model_parallel_attributes(sharded, is_parallel=True, dim=dim, stride=1)
        self.axis_map = {f"{ADAPTER}.{'a' if row_parallel else 'b'}": dim}  # for the layer's sharded_state_dict

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """scaling * B A dropout(x) for the layer's input x [..., in] (row-parallel: this rank's shard)."""
        h = F.linear(self.dropout(x), self.a)
        if self.tp > 1:
            h = reduce_from_tensor_model_parallel_region(h) if self.row_parallel else copy_to_tensor_model_parallel_region(h)
        return F.linear(h, self.b) * self.scaling.to(x.dtype)

    def merged(self, weight: torch.Tensor) -> torch.Tensor:
        """W + scaling * B A for this rank's shard of W, computed in float32, in W's dtype."""
        return merge_lora(weight.detach(), self.a.detach(), self.b.detach(), self.scaling)


def _add_delta(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> tuple:
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + getattr(module, ADAPTER).delta(x), bias


def _sharded_state_dict_with_adapter(module, prefix="", sharded_offsets=(), metadata=None):
    """The layer's own sharded_state_dict (megatron/core/tensor_parallel/layers.py:1060 column, :1303
    row) with the adapter's TP shard declared sharded too (those take every other key as replicated).
    A SwiGLU linear_fc1's rows are [gate_r; up_r] on TP rank r: its B is stored through Megatron's own
    swiglu factory (megatron/core/transformer/mlp.py:264, applied there to the weight only), so that
    every TP size stores the same [gate; up] tensor (TP = 1 stores it as before)."""
    adapter = getattr(module, ADAPTER)
    axis_map = {"weight": 1} if isinstance(module, RowParallelLinear) else {"weight": 0, "bias": 0}
    sharded = make_sharded_tensors_for_checkpoint(
        module.state_dict(prefix="", keep_vars=True), prefix, {**axis_map, **adapter.axis_map},
        sharded_offsets, tp_group=module.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"))
    if adapter.gated_rows:
        key = f"{prefix}{ADAPTER}.b"
        sharded[key] = apply_swiglu_sharded_factory(sharded[key], sharded_offsets,
                                                    (metadata or {}).get("singleton_local_shards", False))
    return sharded


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while hasattr(model, "module"):
        model = model.module
    return model


def _seed(seed: int, layer: int, target: str) -> int:
    return (seed * 1_000_003 + layer) * len(LORA_TARGETS) + LORA_TARGETS.index(target)


def add_adapters(model: torch.nn.Module, config: LoraConfig, seed: int) -> dict[str, int]:
    """Freeze `model` (this rank's GPTModel or VisionLanguageModel, before DDP wraps it) and adapt the
    targeted linear layers of its language model; returns {parameter name: elements} of what now trains."""
    whole = _unwrap(model)
    for param in whole.parameters():  # a VLM's vision tower too: it stays frozen
        param.requires_grad_(False)
    model = cast(torch.nn.Module, getattr(whole, "language_model", whole))  # a VisionLanguageModel: its GPTModel
    tp = parallel_state.get_tensor_model_parallel_world_size()
    swiglu = bool(getattr(getattr(model, "config", None), "gated_linear_unit", False))  # GPTModel's TransformerConfig
    targets = config.lora_target_modules or LORA_TARGETS
    adapted: set[str] = set()
    for name, module in list(model.named_modules()):
        match = _TARGET.match(name)
        if match is None or match["target"] not in targets:
            continue
        if not isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            raise ConfigError(f"--lora-rank: {name} is a {type(module).__name__}: LoRA adapts Megatron's local-spec "
                              "linear layers only (TransformerEngine's fuse the pre-norm into the linear layer); "
                              "add --transformer-impl local")
        layer = model.decoder.layers[int(match["layer"])].layer_number - 1  # global, 0-based
        out_features, in_features = module.weight.shape  # this rank's shard
        generator = torch.Generator().manual_seed(_seed(seed, layer, match["target"]))
        module.add_module(ADAPTER, LoraAdapter(in_features, out_features, config.lora_rank, config.scaling,
                                               config.lora_dropout, generator, like=module.weight,
                                               row_parallel=isinstance(module, RowParallelLinear), tp=tp,
                                               tp_rank=parallel_state.get_tensor_model_parallel_rank()))
        getattr(module, ADAPTER).gated_rows = match["target"] == "linear_fc1" and swiglu
        module.register_forward_hook(_add_delta, with_kwargs=True)
        setattr(module, "sharded_state_dict", functools.partial(_sharded_state_dict_with_adapter, module))
        adapted.add(match["target"])
    # a dense target with no layer to adapt: a MoE model, whose expert MLPs are not adapted
    missing = [t for t in config.lora_target_modules if t not in adapted]
    if missing or not adapted:
        raise ConfigError(f"--lora-target-modules {' '.join(missing or targets)}: no such layer in this model "
                          f"(MoE expert MLPs are not adapted; target {' '.join(_ATTENTION)})")
    return trainable_parameters(whole)


def trainable_parameters(model: torch.nn.Module) -> dict[str, int]:
    return {name: p.numel() for name, p in _unwrap(model).named_parameters() if p.requires_grad}


def is_adapter_key(name: str) -> bool:
    """A parameter / state-dict / dist-checkpoint key of an adapter."""
    return f".{ADAPTER}." in name


def export_weight(model: torch.nn.Module, name: str, param: torch.Tensor) -> torch.Tensor:
    """What the engines get for parameter `name` of the unwrapped model: the merged weight of an
    adapted layer, else the parameter itself. This rank's TP shard either way."""
    adapter = adapter_of(model, name)
    return adapter.merged(param) if adapter is not None else param.detach()


def adapter_of(model: torch.nn.Module, name: str) -> LoraAdapter | None:
    """The adapter of parameter `name` (of the unwrapped model) when it is an adapted layer's weight."""
    module_name, _, leaf = name.rpartition(".")
    adapter = getattr(model.get_submodule(module_name), ADAPTER, None) if leaf == "weight" else None
    return adapter if isinstance(adapter, LoraAdapter) else None


def peft_tensor_name(hf_weight_name: str, matrix: str) -> str:
    """`model.layers.0.self_attn.q_proj.weight`, "A" -> `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`:
    PEFT's names, which SGLang's LoRA loader reads (--lora-sync adapter)."""
    if matrix not in ("A", "B") or not hf_weight_name.endswith(".weight"):
        raise ValueError(f"no LoRA tensor name for {hf_weight_name!r} / {matrix!r}")
    return f"base_model.model.{hf_weight_name[:-len('.weight')]}.lora_{matrix}.weight"


def after_load(model: torch.nn.Module, missing: list[str]) -> list[str]:
    """After load_state_dict(strict=False): adapters the checkpoint lacks (one of the base model, a
    --ref-load) restart at B = 0, no update; those it has must have been trained with the scaling the
    flags give. Returns the missing keys that are not the adapters'."""
    model = _unwrap(model)
    with torch.no_grad():
        for key in missing:
            if key.endswith(f".{ADAPTER}.b"):
                model.get_parameter(key).zero_()
            elif key.endswith(f".{ADAPTER}.scaling"):
                adapter = model.get_submodule(key.rpartition(".")[0])
                adapter.scaling.fill_(adapter.configured_scaling)
    for name, module in model.named_modules():
        if isinstance(module, LoraAdapter) and not math.isclose(float(module.scaling), module.configured_scaling):
            raise ConfigError(f"{name}: the checkpoint's LoRA adapters were trained with alpha / rank = "
                              f"{float(module.scaling):g}, the flags give {module.configured_scaling:g} "
                              "(--lora-alpha / --lora-rank)")
    return [key for key in missing if not is_adapter_key(key)]


def check_request(model_keys: list[str], stored_keys: list[str], source) -> None:
    """Loading a checkpoint with adapters into a model without them would drop the adapters' update."""
    if not any(is_adapter_key(k) for k in model_keys):
        stored = sorted(k for k in stored_keys if is_adapter_key(k))
        if stored:
            raise ConfigError(f"{source} holds LoRA adapters ({stored[0]}, ...): load it with the --lora-rank "
                              "it was trained with")
