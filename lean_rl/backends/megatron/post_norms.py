"""Sandwich norms (GLM-4, Megatron's --post-self-attn-layernorm / --post-mlp-layernorm): an RMSNorm on
the attention output and on the MLP output before each residual add, as transformers' Glm4DecoderLayer
computes them. megatron-core 0.16.1's TransformerLayer has no slot for them
(transformer_layer.py:197 TransformerLayerSubmodules), so the attention and the MLP modules of the layer
spec are swapped for subclasses that own the norm: the parameters are
`self_attention.post_self_attn_layernorm.weight` and `mlp.post_mlp_layernorm.weight`, the names
slime's Megatron fork gives them. Both norms act on whole tokens after the row-parallel projection has
reduced (or reduce-scattered) its output, so they are the same under any TP / SP layout."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules
from megatron.core.transformer.utils import sharded_state_dict_default


def _normed(norm: Any, output: Any, bias: Any) -> tuple[Any, None]:
    if bias is not None:  # a linear bias belongs inside the norm (HF adds it in o_proj / down_proj)
        output = output + bias
    return norm(output), None


class PostNormSelfAttention(SelfAttention):
    def __init__(self, *args: Any, post_norm: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.post_self_attn_layernorm = build_module(post_norm, config=self.config,
                                                     hidden_size=self.config.hidden_size,
                                                     eps=self.config.layernorm_epsilon)

    # every argument passes through to SelfAttention.forward, whatever its signature
    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, None]:  # type: ignore[override]
        output, bias = super().forward(*args, **kwargs)
        return _normed(self.post_self_attn_layernorm, output, bias)


class PostNormMLP(MLP):
    def __init__(self, *args: Any, post_norm: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.post_mlp_layernorm = build_module(post_norm, config=self.config, hidden_size=self.config.hidden_size,
                                               eps=self.config.layernorm_epsilon)

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, None]:
        output, bias = super().forward(*args, **kwargs)
        return _normed(self.post_mlp_layernorm, output, bias)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> Any:
        # MLP.sharded_state_dict (mlp.py:253) asks every child for its own sharded_state_dict, which a
        # plain norm module lacks: the norm is stored as a replicated tensor, as the attention's is.
        norm = self._modules.pop("post_mlp_layernorm")
        assert norm is not None
        try:
            state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        finally:
            self._modules["post_mlp_layernorm"] = norm
        # tp_group: else every TP rank claims the main replica (replica_id needs the TP rank)
        state.update(sharded_state_dict_default(norm, f"{prefix}post_mlp_layernorm.", sharded_offsets, metadata,
                                                tp_group=self.tp_group))
        return state


def layer_submodules(layer_spec: ModuleSpec) -> TransformerLayerSubmodules:
    """The submodules of a GPT layer spec (ModuleSpec types them as object)."""
    return cast(TransformerLayerSubmodules, layer_spec.submodules)


def with_post_norms(layer_spec: ModuleSpec, norm: Any, attention: bool, mlp: bool) -> ModuleSpec:
    """`layer_spec` (a dense GPT layer) with the post-attention and / or post-MLP norm of class / spec
    `norm` added."""
    layer = layer_submodules(layer_spec)

    def swapped(spec: Any, wanted: bool, base: type, cls: type) -> Any:
        if not wanted:
            return spec
        if not isinstance(spec, ModuleSpec) or spec.module is not base:
            raise ValueError(f"post norms need a dense layer spec; it has {spec!r} where {base.__name__} goes")
        return dataclasses.replace(spec, module=cls, params={**spec.params, "post_norm": norm})

    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(
        layer, self_attention=swapped(layer.self_attention, attention, SelfAttention, PostNormSelfAttention),
        mlp=swapped(layer.mlp, mlp, MLP, PostNormMLP)))
