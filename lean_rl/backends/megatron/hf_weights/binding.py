"""Match the parameters of this rank's GPTModel to weight rules, with global layer / expert indices
taken from the model itself (TransformerLayer.layer_number, MoELayer.local_expert_indices), so PP
stage offsets and EP expert offsets are Megatron's own, not recomputed here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lean_rl.backends.megatron.hf_weights.families import WeightRule, canonical_megatron_name
from lean_rl.backends.megatron.lora import is_adapter_key


@dataclass(frozen=True)
class BoundParam:
    name: str  # as in model.named_parameters()
    param: torch.Tensor  # a Parameter, or a buffer the checkpoint stores (expert bias)
    rule: WeightRule
    layer: int | None  # global layer index
    expert: int | None  # global expert index
    local_expert: int | None

    @property
    def hf_names(self) -> tuple[str, ...]:
        return self.rule.hf_names(self.layer, self.expert)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """GPTModel under DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def bind_params(model: torch.nn.Module, rules: tuple[WeightRule, ...]) -> list[BoundParam]:
    """Every parameter of `model` (LoRA adapters aside) with its rule; any parameter without exactly
    one rule is an error."""
    model = unwrap_model(model)
    bound, unmatched = [], []
    # Buffers that are weights of the checkpoint (the router's expert bias, router.py:172) bind too;
    # other buffers (RoPE tables, token counters) have no rule and are skipped.
    buffers = [(n, b) for n, b in model.named_buffers()
               if any(rule.pattern.match(canonical_megatron_name(n)) for rule in rules)]
    for name, param in [*model.named_parameters(), *buffers]:
        if is_adapter_key(name):
            continue  # a LoRA adapter is no HF tensor: export merges it into its layer's weight
        canonical = canonical_megatron_name(name)
        hits = [(rule, m) for rule in rules if (m := rule.pattern.match(canonical))]
        if len(hits) != 1:
            unmatched.append(f"{name} ({len(hits)} rules)")
            continue
        rule, match = hits[0]
        layer = expert = local_expert = None
        if "layer" in match.groupdict():
            transformer_layer = model.decoder.layers[int(match["layer"])]
            layer = transformer_layer.layer_number - 1  # layer_number is global and 1-based
            if "expert" in match.groupdict():
                local_expert = int(match["expert"])
                expert = transformer_layer.mlp.local_expert_indices[local_expert]
        bound.append(BoundParam(name, param, rule, layer, expert, local_expert))
    if unmatched:
        raise ValueError("model parameters without a weight rule: " + ", ".join(unmatched))
    return bound
