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
Checkpoints hold them (the linear's sharded_state_dict takes its children as replicated tensors,
right while the adapters are not tensor-parallel: TP = 1 only, see LoraConfig.check_parallel).
Weight export (sync to the engines, gather_hf_state_dict) sends the merged W + scaling * B A under
the base names (`export_weight`), so SGLang, the probe and the tables see an ordinary model.

A's initial values come from a generator seeded by (--seed, global layer, target), not from the
global RNG: every DP replica and every layout starts from the same adapters."""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from lean_rl.backends.megatron.hf_weights.dist_keys import LORA_ADAPTER, merge_lora
from lean_rl.backends.megatron.train_config import LORA_TARGETS, LoraConfig
from lean_rl.options import ConfigError

ADAPTER = LORA_ADAPTER  # the child module's name under an adapted linear layer
_TARGET = re.compile(r"decoder\.layers\.(?P<layer>\d+)\.(?:self_attention|mlp)\.(?P<target>linear_\w+)$")
_ATTENTION = ("linear_qkv", "linear_proj")


class LoraAdapter(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, rank: int, scaling: float, dropout: float,
                 generator: torch.Generator, like: torch.Tensor):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        a = torch.empty(rank, in_features).uniform_(-bound, bound, generator=generator)
        self.a = torch.nn.Parameter(a.to(device=like.device, dtype=like.dtype))
        self.b = torch.nn.Parameter(torch.zeros(out_features, rank, device=like.device, dtype=like.dtype))
        self.register_buffer("scaling", torch.tensor([scaling], dtype=torch.float32, device=like.device))
        self.configured_scaling = scaling  # the flags' (after_load checks a checkpoint's against it)
        self.dropout = torch.nn.Dropout(dropout)

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """scaling * B A dropout(x) for x [..., in]."""
        return F.linear(F.linear(self.dropout(x), self.a), self.b) * self.scaling.to(x.dtype)

    def merged(self, weight: torch.Tensor) -> torch.Tensor:
        """W + scaling * B A, computed in float32, in W's dtype."""
        return merge_lora(weight.detach(), self.a.detach(), self.b.detach(), self.scaling)


def _add_delta(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> tuple:
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + getattr(module, ADAPTER).delta(x), bias


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while hasattr(model, "module"):
        model = model.module
    return model


def _seed(seed: int, layer: int, target: str) -> int:
    return (seed * 1_000_003 + layer) * len(LORA_TARGETS) + LORA_TARGETS.index(target)


def add_adapters(model: torch.nn.Module, config: LoraConfig, seed: int) -> dict[str, int]:
    """Freeze `model` (this rank's GPTModel, before DDP wraps it) and adapt its targeted linear layers;
    returns {parameter name: elements} of what now trains."""
    model = _unwrap(model)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if tp != 1:
        raise ConfigError(f"--lora-rank needs --tensor-model-parallel-size 1, got {tp}")
    for param in model.parameters():
        param.requires_grad_(False)
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
        out_features, in_features = module.weight.shape
        generator = torch.Generator().manual_seed(_seed(seed, layer, match["target"]))
        module.add_module(ADAPTER, LoraAdapter(in_features, out_features, config.lora_rank, config.scaling,
                                               config.lora_dropout, generator, like=module.weight))
        module.register_forward_hook(_add_delta, with_kwargs=True)
        adapted.add(match["target"])
    # a dense target with no layer to adapt: a MoE model, whose expert MLPs are not adapted
    missing = [t for t in config.lora_target_modules if t not in adapted]
    if missing or not adapted:
        raise ConfigError(f"--lora-target-modules {' '.join(missing or targets)}: no such layer in this model "
                          f"(MoE expert MLPs are not adapted; target {' '.join(_ATTENTION)})")
    return trainable_parameters(model)


def trainable_parameters(model: torch.nn.Module) -> dict[str, int]:
    return {name: p.numel() for name, p in _unwrap(model).named_parameters() if p.requires_grad}


def is_adapter_key(name: str) -> bool:
    """A parameter / state-dict / dist-checkpoint key of an adapter."""
    return f".{ADAPTER}." in name


def export_weight(model: torch.nn.Module, name: str, param: torch.Tensor) -> torch.Tensor:
    """What the engines get for parameter `name` of the unwrapped model: the merged weight of an
    adapted layer, else the parameter itself. This rank's shard either way (TP = 1: the whole)."""
    module_name, _, leaf = name.rpartition(".")
    adapter = getattr(model.get_submodule(module_name), ADAPTER, None) if leaf == "weight" else None
    return adapter.merged(param) if isinstance(adapter, LoraAdapter) else param.detach()


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
