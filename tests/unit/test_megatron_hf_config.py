import json

import pytest

from lean_rl.backends.megatron.hf_config import (
    SUPPORTED_HF_FAMILIES,
    arch_from_hf_config,
    check_arch_matches_checkpoint,
    hf_family,
)
from lean_rl.options import ConfigError


def hf_config(path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("family", SUPPORTED_HF_FAMILIES)
def test_tiny_checkpoints_derive_the_megatron_arch(family, tiny_model_factory):
    path = tiny_model_factory(family)
    arch = arch_from_hf_config(path)
    assert hf_family(path) == family
    mla = family == "deepseek_v3"  # multi-latent attention: no query groups; kv_channels = v_head_dim
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_query_groups, arch.kv_channels) == (
        2, 64, 4, 4 if mla else 2, 16)
    assert (arch.vocab_size, arch.max_position_embeddings, arch.seq_length) == (512, 4096, 4096)
    assert arch.normalization == "RMSNorm" and arch.norm_epsilon == 1e-6 and arch.rotary_base == 10000.0
    assert arch.swiglu and not arch.add_bias_linear and arch.untie_embeddings_and_output_weights
    assert arch.add_qkv_bias == (family in ("qwen2", "glm4", "glm4_moe"))
    assert arch.qk_layernorm == (family.startswith("qwen3") or mla or family == "glm4_moe")  # MLA: latent norms
    glm4 = family == "glm4"  # half-rotary interleaved RoPE, sandwich norms
    half = 0.5 if family in ("glm4", "glm4_moe") else 1.0  # glm4_moe: the first half by halves, not interleaved
    assert (arch.rotary_percent, arch.rotary_interleaved) == (half, glm4)
    assert arch.post_self_attn_layernorm == arch.post_mlp_layernorm == glm4
    assert arch.ffn_hidden_size == (128 if family == "mixtral" else 256)  # mixtral's experts: intermediate_size
    if family == "glm4_moe":  # one dense layer, then MoE with a shared expert and a sigmoid router
        assert (arch.num_experts, arch.moe_router_topk, arch.moe_ffn_hidden_size) == (4, 2, 128)
        assert arch.moe_layers == (False, True) and arch.moe_shared_expert_intermediate_size == 128
        assert (arch.moe_router_score_function, arch.moe_router_enable_expert_bias) == ("sigmoid", True)
        assert arch.moe_router_topk_scaling_factor == 2.5 and arch.moe_router_group_topk is None
    elif family in ("qwen3_moe", "mixtral"):  # mixtral: softmax top-k, always renormalised
        assert (arch.num_experts, arch.moe_router_topk, arch.moe_ffn_hidden_size) == (4, 2, 128)
        assert arch.moe_router_pre_softmax is False  # norm_topk_prob: softmax over the top-k logits
    elif mla:
        assert (arch.num_experts, arch.moe_router_topk, arch.moe_ffn_hidden_size) == (4, 2, 128)
        assert arch.moe_layers == (False, True) and arch.moe_shared_expert_intermediate_size == 128
        assert (arch.q_lora_rank, arch.kv_lora_rank, arch.qk_head_dim, arch.qk_pos_emb_head_dim) == (32, 32, 16, 8)
        assert (arch.rope_type, arch.rotary_scaling_factor, arch.mscale_all_dim) == ("yarn", 4.0, 1.0)
        assert (arch.moe_router_score_function, arch.moe_router_enable_expert_bias) == ("sigmoid", True)
        assert (arch.moe_router_num_groups, arch.moe_router_group_topk, arch.moe_router_topk_scaling_factor) == (
            2, 1, 2.5)
    else:
        assert arch.num_experts is None


def test_the_same_config_as_dict_path_or_file(tiny_qwen2):
    config = hf_config(tiny_qwen2)
    assert arch_from_hf_config(config) == arch_from_hf_config(tiny_qwen2) == arch_from_hf_config(
        tiny_qwen2 / "config.json")
    assert arch_from_hf_config(config, make_vocab_size_divisible_by=96, seq_length=512).seq_length == 512


def test_unsupported_model_type_names_the_supported_ones(tiny_qwen2):
    config = {**hf_config(tiny_qwen2), "model_type": "gemma3_text"}
    with pytest.raises(ConfigError, match="'gemma3_text' is not supported; supported: llama, qwen2, qwen3, qwen3_moe, "
                                          "mistral, glm4, deepseek_v3, mixtral, glm4_moe$"):
        arch_from_hf_config(config)


@pytest.mark.parametrize("family, change, message", [
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_type='llama3'"),
    ("llama", {"attention_bias": True}, "attention_bias=true"),
    ("llama", {"mlp_bias": True}, "mlp_bias=true"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window=true"),
    ("qwen2", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, "mlp_only_layers"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("mistral", {"sliding_window": 1024}, "sliding_window=1024"),
    ("mixtral", {"sliding_window": 1024}, "sliding_window=1024"),
    ("mixtral", {"router_jitter_noise": 0.01}, "router_jitter_noise"),
    ("glm4_moe", {"n_group": 2, "topk_group": 1}, "group-limited routing"),
    ("glm4_moe", {"norm_topk_prob": False}, "norm_topk_prob=false"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
])
def test_features_without_an_exact_megatron_equivalent_are_errors(family, change, message, tiny_model_factory):
    config = {**hf_config(tiny_model_factory(family)), **change}
    with pytest.raises(ConfigError, match=f"{family} config: .*{message}.* is not supported"):
        arch_from_hf_config(config)


def test_a_sliding_window_that_covers_every_position_is_full_attention(tiny_model_factory):
    """Ministral-8B-Instruct-2410 is model_type mistral with sliding_window == max_position_embeddings."""
    mistral = hf_config(tiny_model_factory("mistral"))
    assert arch_from_hf_config({**mistral, "sliding_window": 4096}) == arch_from_hf_config(mistral)
    with pytest.raises(ConfigError, match="layer_types other than full_attention"):
        arch_from_hf_config({**mistral, "layer_types": ["sliding_attention", "full_attention"]})


def test_glm4_old_style_config_keeps_its_half_rotary(tiny_model_factory):
    glm4 = {k: v for k, v in hf_config(tiny_model_factory("glm4")).items() if k not in ("rope_parameters",
                                                                                     "partial_rotary_factor")}
    arch = arch_from_hf_config({**glm4, "rope_theta": 10000.0})  # transformers' Glm4 default: 0.5
    assert (arch.rotary_percent, arch.rotary_interleaved, arch.add_qkv_bias) == (0.5, True, True)


def test_router_tied_embeddings_and_old_rope_keys(tiny_model_factory):
    moe = hf_config(tiny_model_factory("qwen3_moe"))
    assert arch_from_hf_config({**moe, "norm_topk_prob": False}).moe_router_pre_softmax is True
    llama = hf_config(tiny_model_factory("llama"))
    assert not arch_from_hf_config({**llama, "tie_word_embeddings": True}).untie_embeddings_and_output_weights
    old_style = {k: v for k, v in llama.items() if k != "rope_parameters"} | {"rope_theta": 1e6, "rope_scaling": None}
    assert arch_from_hf_config(old_style).rotary_base == 1e6
    with pytest.raises(ConfigError, match="rope_scaling"):
        arch_from_hf_config(old_style | {"rope_scaling": {"type": "linear", "factor": 2.0}})


def test_flags_must_match_the_checkpoint(tiny_qwen2, tiny_model_factory):
    arch = arch_from_hf_config(tiny_qwen2, make_vocab_size_divisible_by=96, seq_length=1024)
    check_arch_matches_checkpoint(arch, tiny_qwen2)  # padding multiple and seq length are ours
    with pytest.raises(ConfigError, match=r"--add-qkv-bias: True != False; --qk-layernorm: False != True"):
        check_arch_matches_checkpoint(arch, tiny_model_factory("qwen3"))


def test_deepseek_v3_configs_megatron_cannot_reproduce_are_refused():
    from published_hf_configs import PUBLISHED

    base = PUBLISHED["deepseek-v3"]
    moonlight_like = arch_from_hf_config({**base, "q_lora_rank": None, "n_group": 1, "topk_group": 1})
    assert moonlight_like.q_lora_rank is None and moonlight_like.moe_router_group_topk is None
    for change, field in (({"topk_group": 3}, "group-limited routing"), ({"norm_topk_prob": False}, "norm_topk_prob"),
                          ({"scoring_func": "softmax"}, "scoring_func"), ({"rope_interleave": False}, "rope_interleave"),
                          ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling")):
        with pytest.raises(ConfigError, match=field):
            arch_from_hf_config({**base, **change})
