"""Megatron's multi-latent attention on the local (non-TransformerEngine) spec. megatron-core 0.16.1's
MLASelfAttention builds its core attention with `k_channels=` and `v_channels=`
(transformer/multi_latent_attention.py:155-165), keywords TEDotProductAttention takes but the local
DotProductAttention does not (transformer/dot_product_attention.py:42), so the local MLA spec
(models/gpt/gpt_layer_specs.py:366) fails at construction. The local class computes MLA correctly as it
is: q·k over the q head dim, probabilities times v over the v head dim, output reshaped by kv_channels x
heads (dot_product_attention.py:65, :245), and the softmax scale (YaRN's mscale included) comes in as
`softmax_scale`. So this subclass takes the two keywords and requires v_channels == kv_channels (the
arch sets kv_channels = v_head_dim for MLA, hf_config.py).

Without TransformerEngine, megatron/core/extensions/transformer_engine.py still imports, with stand-in
(non-type) TE classes, so multi_latent_attention.py:54-62 sets HAVE_TE = True and its
`isinstance(self.linear_proj, TELinear)` (multi_latent_attention.py:185, an fp8-only branch) raises;
`disable_stand_in_te()` turns that flag off where TELinear is no class."""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec


class MLADotProductAttention(DotProductAttention):
    def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if v_channels is not None and v_channels != self.config.kv_channels:
            raise ValueError(f"MLA on the local spec needs --kv-channels == --v-head-dim ({v_channels}), "
                             f"got {self.config.kv_channels}")


def with_local_mla_core_attention(layer_spec: ModuleSpec) -> ModuleSpec:
    """`layer_spec` with the local core attention of an MLA layer replaced by MLADotProductAttention."""
    attention = getattr(layer_spec.submodules, "self_attention", None)
    if not (isinstance(attention, ModuleSpec) and attention.module is MLASelfAttention
            and attention.submodules.core_attention is DotProductAttention):
        return layer_spec
    mla = dataclasses.replace(attention, submodules=dataclasses.replace(attention.submodules,
                                                                        core_attention=MLADotProductAttention))
    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(layer_spec.submodules, self_attention=mla))


def disable_stand_in_te() -> None:
    """HAVE_TE off in multi_latent_attention where its TELinear is a stand-in (no TE installed)."""
    if not isinstance(multi_latent_attention.TELinear, type):
        multi_latent_attention.HAVE_TE = False
