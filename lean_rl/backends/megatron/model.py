"""Build this rank's GPTModel from a MegatronConfig (after distributed.init_distributed)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from lean_rl.backends.megatron.compat import uses_te_layer_spec
from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.mla_moe import layer_block_spec, mla_config, moe_extras
from lean_rl.backends.megatron.post_norms import layer_submodules, with_post_norms


def transformer_config(config: MegatronConfig, device: torch.device) -> TransformerConfig:
    """Megatron's TransformerConfig for `config`, in config.params_dtype (bf16 / fp16 set Megatron's
    bf16 / fp16 switches: softmax and the gradient reduction stay float32, as in Megatron's --bf16)."""
    arch, par = config.arch, config.parallel
    params_dtype = getattr(torch, config.params_dtype)
    moe = {}
    if arch.is_moe:
        moe = dict(
            num_moe_experts=arch.num_experts,
            moe_router_topk=arch.moe_router_topk,
            moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
            moe_router_pre_softmax=arch.moe_router_pre_softmax,
            moe_router_load_balancing_type=arch.moe_router_load_balancing_type,
            moe_aux_loss_coeff=arch.moe_aux_loss_coeff,
            moe_token_dispatcher_type=par.moe_token_dispatcher_type,
            moe_grouped_gemm=False,  # SequentialMLP: per-expert linears, the names the tables use
            **moe_extras(arch),
        )
    config_class, mla = mla_config(arch)
    return config_class(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.kv_channels,
        normalization=arch.normalization,
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=arch.swiglu,
        activation_func=F.silu if arch.swiglu else F.gelu,
        add_bias_linear=arch.add_bias_linear,
        add_qkv_bias=arch.add_qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        hidden_dropout=arch.hidden_dropout,
        attention_dropout=arch.attention_dropout,
        tensor_model_parallel_size=par.tensor_model_parallel_size,
        pipeline_model_parallel_size=par.pipeline_model_parallel_size,
        expert_model_parallel_size=par.expert_model_parallel_size,
        expert_tensor_parallel_size=par.expert_tensor_parallel_size,
        sequence_parallel=par.sequence_parallel,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=device.type == "cpu",
        # Fused kernels are CUDA/TE-only or change numerics; exact parity with HF comes first.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        **moe,
        **mla,
        rotary_interleaved=arch.rotary_interleaved,
    )


def build_gpt_model(config: MegatronConfig, device: torch.device, mrope_section: list[int] | None = None) -> GPTModel:
    """This rank's pipeline stage of the model (pre/post process from parallel_state), on `device`,
    in eval mode, its weights in config.params_dtype. Not wrapped in Megatron's Float16Module: the
    inputs are token ids and every consumer of the logits casts them to float32 itself (logprobs.py,
    logits.py, the value head). Weights are Megatron's random init until an HF checkpoint is loaded."""
    arch = config.arch
    tconfig = transformer_config(config, device)
    if mrope_section is not None:  # a vision-language model's LM (vlm_model.py): M-RoPE, positions [3, b, s]
        tconfig.mrope_section = list(mrope_section)
    norm: object
    te = uses_te_layer_spec(device, config.transformer_impl)
    block = layer_block_spec(arch, tconfig, te)  # MLA / dense-then-MoE: one spec per layer
    if te:
        from megatron.core.extensions.transformer_engine import TENorm

        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=arch.num_experts, moe_grouped_gemm=False,
                                                          qk_layernorm=arch.qk_layernorm)
        norm = TENorm
    else:
        spec = get_gpt_layer_local_spec(num_experts=arch.num_experts, moe_grouped_gemm=False,
                                        qk_layernorm=arch.qk_layernorm, normalization=arch.normalization)
        norm = layer_submodules(spec).input_layernorm  # the local spec's norm class
    if arch.post_self_attn_layernorm or arch.post_mlp_layernorm:
        spec = with_post_norms(spec, norm, arch.post_self_attn_layernorm, arch.post_mlp_layernorm)
    model = GPTModel(
        config=tconfig,
        # a block spec is what GPTModel's TransformerBlock also takes (annotated ModuleSpec only)
        transformer_layer_spec=cast(ModuleSpec, block) if block is not None else spec,
        vocab_size=config.padded_vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,  # logits stay vocab-parallel [b, s, V/tp]; logprobs.py reduces them
        share_embeddings_and_output_weights=not arch.untie_embeddings_and_output_weights,
        position_embedding_type="mrope" if mrope_section is not None else arch.position_embedding_type,
        rotary_base=arch.rotary_base,
        rotary_percent=arch.rotary_percent,
    )
    # 16-bit: every weight in that dtype, norms included (the local spec makes its norms in float32),
    # as Megatron's Float16Module and SGLang keep them; the optimizer holds the float32 masters
    return model.to(device=device, dtype=tconfig.params_dtype).eval()
