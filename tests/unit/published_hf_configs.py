"""The architecture fields of published HF config.json files (huggingface.co/<name>/blob/main/config.json)
that scripts/models/*.sh are derived from. Only what arch_from_hf_config reads is kept."""

_QWEN = dict(hidden_act="silu", rms_norm_eps=1e-06, rope_theta=1000000.0, vocab_size=151936, rope_scaling=None)

PUBLISHED = {
    "qwen2.5-0.5B": dict(  # Qwen/Qwen2.5-0.5B
        _QWEN, model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768),
    "qwen3-0.6B": dict(  # Qwen/Qwen3-0.6B
        _QWEN, model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False),
    "qwen3-4B": dict(  # Qwen/Qwen3-4B
        _QWEN, model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=2560, intermediate_size=9728,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False),
    "qwen3-30B-A3B": dict(  # Qwen/Qwen3-30B-A3B
        _QWEN, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=2048,
        intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=40960, tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[]),
    "llama3-8B": dict(  # meta-llama/Meta-Llama-3-8B
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=8192, rms_norm_eps=1e-05, rope_theta=500000.0, rope_scaling=None,
        vocab_size=128256, tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
    "mistral-7B-v0.3": dict(  # mistralai/Mistral-7B-v0.3
        model_type="mistral", architectures=["MistralForCausalLM"], hidden_act="silu", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=32768, rms_norm_eps=1e-05, rope_theta=1000000.0, sliding_window=None,
        vocab_size=32768, tie_word_embeddings=False),
    "glm4-9B-0414": dict(  # THUDM/GLM-4-9B-0414
        model_type="glm4", architectures=["Glm4ForCausalLM"], attention_bias=True, head_dim=128, hidden_act="silu",
        hidden_size=4096, intermediate_size=13696, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=2, max_position_embeddings=32768, partial_rotary_factor=0.5, rms_norm_eps=1e-05,
        rope_theta=10000.0, vocab_size=151552, tie_word_embeddings=False),
    # deepseek-ai/DeepSeek-V3 (and DeepSeek-R1, the same architecture): the architecture fields of its
    # config.json as published (its fp8 quantization_config and MTP layer count aside)
    "deepseek-v3": dict(
        model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], attention_bias=False,
        first_k_dense_replace=3, hidden_act="silu", hidden_size=7168, intermediate_size=18432, kv_lora_rank=512,
        max_position_embeddings=163840, moe_intermediate_size=2048, moe_layer_freq=1, n_group=8,
        n_routed_experts=256, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=128,
        num_experts_per_tok=8, num_hidden_layers=61, num_key_value_heads=128, q_lora_rank=1536,
        qk_nope_head_dim=128, qk_rope_head_dim=64, rms_norm_eps=1e-06,
        rope_scaling=dict(beta_fast=32, beta_slow=1, factor=40, mscale=1.0, mscale_all_dim=1.0,
                          original_max_position_embeddings=4096, type="yarn"),
        rope_theta=10000, routed_scaling_factor=2.5, scoring_func="sigmoid", tie_word_embeddings=False,
        topk_group=4, topk_method="noaux_tc", v_head_dim=128, vocab_size=129280),
    "mixtral-8x7B-v0.1": dict(  # mistralai/Mixtral-8x7B-v0.1
        model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_act="silu", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=32768, rms_norm_eps=1e-05, rope_theta=1000000.0, vocab_size=32000,
        num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.02, tie_word_embeddings=False),
    "glm4.5-air": dict(  # zai-org/GLM-4.5-Air (its MTP layer aside: num_nextn_predict_layers=1)
        model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], attention_bias=True, first_k_dense_replace=1,
        head_dim=128, hidden_act="silu", hidden_size=4096, intermediate_size=10944, max_position_embeddings=131072,
        moe_intermediate_size=1408, n_group=1, n_routed_experts=128, n_shared_experts=1, norm_topk_prob=True,
        num_attention_heads=96, num_experts_per_tok=8, num_hidden_layers=46, num_key_value_heads=8,
        partial_rotary_factor=0.5, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=1000000,
        routed_scaling_factor=1.0, tie_word_embeddings=False, topk_group=1, use_qk_norm=False, vocab_size=151552),
}
