"""Megatron settings for multi-latent attention and DeepSeek-style MoE (DeepSeek-V3, Kimi-K2,
Moonlight): MLATransformerConfig's fields, the router's sigmoid / expert-bias / group-limited options,
and a per-layer block spec when dense and MoE layers mix (--moe-layer-freq). Only the families that use
them get them: every other model's TransformerConfig and layer spec stay as before."""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

from lean_rl.backends.megatron.model_arch import ModelArch, moe_layer_pattern
from lean_rl.backends.megatron.mla_compat import disable_stand_in_te, with_local_mla_core_attention


def moe_extras(arch: ModelArch) -> dict[str, Any]:
    """TransformerConfig MoE keywords beyond the softmax top-k router, where the arch sets them."""
    extras: dict[str, Any] = {}
    pattern = moe_layer_pattern(arch.moe_layer_freq, arch.num_layers)
    if not all(pattern):
        extras["moe_layer_freq"] = pattern
    if arch.moe_shared_expert_intermediate_size:
        extras["moe_shared_expert_intermediate_size"] = arch.moe_shared_expert_intermediate_size
        extras["moe_shared_expert_overlap"] = False  # its side stream is CUDA-only (shared_experts.py:123)
    if arch.moe_router_score_function != "softmax":
        extras["moe_router_score_function"] = arch.moe_router_score_function
    if arch.moe_router_enable_expert_bias:
        # The checkpoint's bias is kept: a bias update (router.py _apply_expert_bias, then
        # finalize_model_grads) would change routing between what the engines serve and the trainer.
        extras.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0)
    if arch.moe_router_group_topk:
        extras.update(moe_router_num_groups=arch.moe_router_num_groups, moe_router_group_topk=arch.moe_router_group_topk)
    if arch.moe_router_topk_scaling_factor is not None:
        extras["moe_router_topk_scaling_factor"] = arch.moe_router_topk_scaling_factor
    return extras


def mla_config(arch: ModelArch) -> tuple[type[TransformerConfig], dict[str, Any]]:
    """(the config class, its MLA keywords): MLATransformerConfig for --multi-latent-attention."""
    if not arch.multi_latent_attention:
        return TransformerConfig, {}
    return MLATransformerConfig, dict(
        q_lora_rank=arch.q_lora_rank, kv_lora_rank=arch.kv_lora_rank, qk_head_dim=arch.qk_head_dim,
        qk_pos_emb_head_dim=arch.qk_pos_emb_head_dim, v_head_dim=arch.v_head_dim, rope_type=arch.rope_type,
        rotary_scaling_factor=arch.rotary_scaling_factor,
        original_max_position_embeddings=arch.original_max_position_embeddings, beta_fast=arch.beta_fast,
        beta_slow=arch.beta_slow, mscale=arch.mscale, mscale_all_dim=arch.mscale_all_dim)


def layer_block_spec(arch: ModelArch, tconfig: TransformerConfig, te: bool) -> TransformerBlockSubmodules | None:
    """Megatron's own per-layer block spec (gpt_layer_specs.py get_gpt_decoder_block_spec: MLA or not,
    dense or MoE per --moe-layer-freq, this pipeline stage's layers) where one layer spec cannot
    describe the model; None elsewhere."""
    if not (arch.multi_latent_attention or not all(arch.moe_layers) and arch.is_moe):
        return None
    if te and arch.multi_latent_attention and tconfig.tensor_model_parallel_size > 1:
        # The TE spec's MLA down projections are TELinear 'duplicated' (multi_latent_attention.py:409,
        # :454), whole on every TP rank; the weight tables map the local spec's column-parallel ones.
        raise ValueError("multi-latent attention with TransformerEngine and --tensor-model-parallel-size > 1 is not "
                         "supported yet; use --transformer-impl local or TP 1")
    block = get_gpt_decoder_block_spec(tconfig, use_transformer_engine=te, normalization=arch.normalization)
    if te:
        return block
    disable_stand_in_te()
    return dataclasses.replace(block, layer_specs=[with_local_mla_core_attention(s) for s in block.layer_specs or []])
