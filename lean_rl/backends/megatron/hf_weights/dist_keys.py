"""Where each weight rule lives in a Megatron `torch_dist` checkpoint: the sharded keys, global shapes
and chunk offsets of `GPTModel.sharded_state_dict()` (default metadata, megatron-core 0.16.1), derived
from the per-family tables in families.py. Pure: no Megatron import, so converters can use it on any
machine; tests/integration/test_convert_megatron.py checks it against a real model's sharded state dict.

Megatron's conventions (what the derivation encodes):
- a parameter of decoder layer i is stored under the layer-less name (`decoder.layers.X`), stacked on
  a leading axis of size num_layers (TransformerBlock.sharded_state_dict, transformer_block.py:845);
- an expert's parameter is stacked on a second axis of size num_experts under
  `decoder.layers.mlp.experts.experts.Y` (SequentialMLP.sharded_state_dict, experts.py:777);
- the pre-norms are stored under TransformerEngine's fused names (`self_attention.linear_qkv.
  layer_norm_weight`, `mlp.linear_fc1.layer_norm_weight`) by the local spec too
  (gpt_layer_specs.py:417), except that the TE spec keeps a MoE layer's pre-MLP norm as its own module
  (`pre_mlp_layernorm.weight`, gpt_layer_specs.py:291): converters write that one under both names;
- TP shards reassemble to the TP=1 parameter (fc1 as [gate; up], QKV grouped per query group), so a
  checkpoint holds TP=1 tensors, except that the vocab rows are padded for the TP it was made for;
- every linear module also has an `_extra_state` object (None for the local spec), one per layer /
  expert, keyed `{key}/shard_{offsets}_{shape}`; the output layer's is dropped (language_module.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_weights.families import WeightRule, in_layer

_LAYER = "decoder.layers.{layer}."
_EXPERT = "mlp.experts.local_experts.{expert}."
# Megatron's local-spec sharded_state_dict_keys_map (gpt_layer_specs.py:417), applied inside a layer.
_LOCAL_SPEC_KEYS_MAP = (("input_layernorm.", "self_attention.linear_qkv.layer_norm_"),
                        ("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"))
_LINEAR_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "linear_q_proj", "linear_q_down_proj",
                   "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj")
EXTRA_STATE = "_extra_state"
# A LoRA adapter (backends/megatron/lora.py) is a child module of its linear layer: A [r, in], B [out, r]
# and scaling [1] (alpha / rank), stacked over layers like the layer's weight.
LORA_ADAPTER = "lora"


def merge_lora(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling) -> torch.Tensor:
    """W + scaling * B A, computed in float32, in W's dtype: what the engines are sent (lora.py) and
    what the converter writes of a LoRA-trained checkpoint (convert/megatron_to_hf.py)."""
    return (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)


def lora_keys(weight_key: str) -> tuple[str, str, str]:
    """The keys (A, B, scaling) of the LoRA adapter of the linear layer whose weight is `weight_key`."""
    module = weight_key.removesuffix(".weight")
    return tuple(f"{module}.{LORA_ADAPTER}.{leaf}" for leaf in ("a", "b", "scaling"))


@dataclass(frozen=True)
class DistEntry:
    """One weight rule in the dist checkpoint."""

    rule: WeightRule
    keys: tuple[str, ...]  # the sharded key(s); keys[0] is what the local spec loads
    stacked: tuple[str, ...]  # leading axes: () | ("layer",) | ("layer", "expert")
    param_shape: tuple[int, ...]  # the TP=1 parameter (padded vocab rows for embedding / output)
    layer: int | None = None  # set where each layer has keys of its own (non_homogeneous_layers)

    def global_shape(self, arch: ModelArch) -> tuple[int, ...]:
        return tuple(_axis_size(axis, arch) for axis in self.stacked) + self.param_shape

    def chunk_offsets(self, index: dict[str, int]) -> tuple[int, ...]:
        """Offsets of one rule instance ({layer, expert}) in the global tensor."""
        return tuple(index[axis] for axis in self.stacked) + (0,) * len(self.param_shape)

    def chunk_sizes(self) -> tuple[int, ...]:
        return (1,) * len(self.stacked) + self.param_shape


def _axis_size(axis: str, arch: ModelArch) -> int:
    return arch.num_layers if axis == "layer" else arch.num_experts


def megatron_param_shape(rule: WeightRule, arch: ModelArch, padded_vocab_size: int) -> tuple[int, ...]:
    """The shape of the rule's parameter at TP=1 (the global tensor of one layer / expert)."""
    name, hidden, kv = rule.megatron, arch.hidden_size, arch.kv_channels
    qkv_rows = (arch.num_attention_heads + 2 * arch.num_query_groups) * kv
    ffn = arch.moe_ffn_hidden_size if "{expert}" in name else arch.ffn_hidden_size
    if "shared_experts." in name:
        ffn = arch.moe_shared_expert_intermediate_size
    glu = 2 if arch.swiglu else 1
    heads, q_head = arch.num_attention_heads, arch.qk_head_dim + arch.qk_pos_emb_head_dim
    shapes = {
        "embedding.word_embeddings.weight": (padded_vocab_size, hidden),
        "output_layer.weight": (padded_vocab_size, hidden),
        "self_attention.q_layernorm.weight": (kv,),
        "self_attention.k_layernorm.weight": (kv,),
        "layernorm.weight": (hidden,),  # input_, pre_mlp_, final_
        "self_attention.linear_qkv.weight": (qkv_rows, hidden),
        "self_attention.linear_qkv.bias": (qkv_rows,),
        "self_attention.linear_proj.weight": (hidden, arch.num_attention_heads * kv),
        "linear_fc1.weight": (glu * (ffn or 0), hidden),
        "linear_fc2.weight": (hidden, ffn or 0),
        "mlp.router.weight": (arch.num_experts or 0, hidden),
        "mlp.router.expert_bias": (arch.num_experts or 0,),
        "self_attention.linear_q_down_proj.weight": (arch.q_lora_rank or 0, hidden),
        "self_attention.linear_q_up_proj.weight": (heads * q_head, arch.q_lora_rank or 0),
        "self_attention.linear_q_proj.weight": (heads * q_head, hidden),
        "self_attention.linear_kv_down_proj.weight": (arch.kv_lora_rank + arch.qk_pos_emb_head_dim, hidden),
        "self_attention.kv_layernorm.weight": (arch.kv_lora_rank,),
        "self_attention.linear_kv_up_proj.weight": (heads * (arch.qk_head_dim + arch.v_head_dim), arch.kv_lora_rank),
    }
    if arch.multi_latent_attention:
        shapes["self_attention.q_layernorm.weight"] = (arch.q_lora_rank or 0,)
    for suffix, shape in sorted(shapes.items(), key=lambda item: -len(item[0])):  # most specific first
        if name.endswith(suffix):
            return shape
    raise ValueError(f"no dist-checkpoint shape known for Megatron parameter {name!r}; extend dist_keys.py")


def per_layer_keys(arch: ModelArch) -> bool:
    """Whether each layer has keys of its own: Megatron stores dense and MoE layers that mix
    (--moe-layer-freq) under `decoder.layers.{i}.` with no layer axis (transformer_block.py:830-868)."""
    return arch.is_moe and not all(arch.moe_layers)


def _dist_names(template: str, arch: ModelArch, layer: int | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not template.startswith(_LAYER):
        return (template,), ()
    rest = template[len(_LAYER):]
    stacked: tuple[str, ...] = ("layer",)
    if rest.startswith(_EXPERT):
        rest, stacked = "mlp.experts.experts." + rest[len(_EXPERT):], ("layer", "expert")
    if layer is not None:
        stacked = stacked[1:]
    names = [rest]
    # The MLA local spec has no keys map (gpt_layer_specs.py:366): its norms keep their own names.
    for prefix, replacement in () if arch.multi_latent_attention else _LOCAL_SPEC_KEYS_MAP:
        if rest.startswith(prefix):
            names = [replacement + rest[len(prefix):]]
            if prefix == "pre_mlp_layernorm." and arch.is_moe:
                names.append(rest)  # the TE spec's separate MoE pre-MLP norm
    layer_prefix = "decoder.layers." if layer is None else f"decoder.layers.{layer}."
    return tuple(layer_prefix + name for name in names), stacked


def dist_entries(rules: tuple[WeightRule, ...], arch: ModelArch, padded_vocab_size: int) -> list[DistEntry]:
    """The stored tensors of a model, one entry per rule (the tied output layer is not stored: Megatron
    keys it to the embedding as a non-main replica)."""
    entries = []
    for rule in rules:
        if not rule.exported:
            continue
        shape = megatron_param_shape(rule, arch, padded_vocab_size)
        if per_layer_keys(arch) and rule.megatron.startswith(_LAYER):
            for layer in range(arch.num_layers):
                if in_layer(rule, arch, layer):
                    keys, stacked = _dist_names(rule.megatron, arch, layer)
                    entries.append(DistEntry(rule, keys, stacked, shape, layer))
            continue
        keys, stacked = _dist_names(rule.megatron, arch)
        entries.append(DistEntry(rule, keys, stacked, shape))
    return entries


def extra_state_keys(rules: tuple[WeightRule, ...], arch: ModelArch) -> list[str]:
    """Unique keys of the `_extra_state` objects of every linear module in the decoder layers (per
    layer where layers have keys of their own: `/shard_0_1` when nothing is stacked)."""
    keys: list[str] = []
    for rule in rules:
        module, _ = rule.megatron.rsplit(".", 1)
        if not rule.megatron.startswith(_LAYER) or module.rsplit(".", 1)[-1] not in _LINEAR_MODULES:
            continue
        layers = [layer for layer in range(arch.num_layers) if in_layer(rule, arch, layer)]
        for layer in layers if per_layer_keys(arch) else [None]:
            (key, *_), stacked = _dist_names(f"{module}.{EXTRA_STATE}", arch, layer)
            shape = [_axis_size(axis, arch) for axis in stacked] or [1]
            indices = [[i] for i in range(shape[0])]
            if len(stacked) == 2:
                indices = [[layer, expert] for layer in range(shape[0]) for expert in range(shape[1])]
            for index in indices:
                unique = f"{key}/shard_{'.'.join(map(str, index))}_{'.'.join(map(str, shape))}"
                if unique not in keys:
                    keys.append(unique)
    return keys


def is_model_key(key: str) -> bool:
    """A dist-checkpoint key that belongs to GPTModel (not optimizer / RNG / trainer state)."""
    return key.startswith(("embedding.", "decoder.", "output_layer."))
