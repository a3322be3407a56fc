"""HF config.json -> ModelArch for the supported families, one entry per family (`_FAMILIES`). Anything the Megatron model or the weight
tables cannot reproduce exactly (sliding window, rope scaling, extra biases, dense layers inside a
MoE model...) is an error here, not a silent approximation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from lean_rl.backends.megatron.config import arch_differences
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.options import ConfigError


def load_hf_config(path_or_dict: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint directory, a config.json path, or an already-parsed dict."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"HF config not found: {path}")
    return json.loads(path.read_text())


# Vision-language model_type -> the text family of its language model (its architecture and weight table
# here and in families.py); vlm_family.VLM_FAMILIES adds the vision side of each.
VLM_TEXT_FAMILIES = {"qwen2_5_vl": "qwen2"}


def text_config_of(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """A vision-language config's language model as its text family's config.json."""
    family = hf_config.get("model_type")
    if family not in VLM_TEXT_FAMILIES:
        raise ConfigError(f"HF model_type {family!r} is not a supported vision-language family; supported: "
                          f"{', '.join(VLM_TEXT_FAMILIES)}")
    text = hf_config.get("text_config")
    if not isinstance(text, Mapping):
        raise ConfigError(f"{family} config: no text_config section")
    # tie_word_embeddings is a top-level field of the VLM config (the LM head is the VLM's)
    return {**text, "model_type": VLM_TEXT_FAMILIES[str(family)],
            "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))}


def hf_family(path_or_dict: str | Path | Mapping[str, Any]) -> str:
    """The weight-table family of an HF config: its `model_type`, if supported."""
    config = load_hf_config(path_or_dict)
    family = config.get("model_type")
    if family in VLM_TEXT_FAMILIES:  # the weight table is the VLM's (vlm_weights.py)
        return str(family)
    if family not in SUPPORTED_HF_FAMILIES:
        raise ConfigError(f"HF model_type {family!r} is not supported; supported: {', '.join(SUPPORTED_HF_FAMILIES)}")
    return family


def checkpoint_dtype(path_or_dict: str | Path | Mapping[str, Any]) -> str | None:
    """The dtype an HF config declares ("bfloat16", ...: `dtype`, or `torch_dtype` before transformers 5),
    if any."""
    config = load_hf_config(path_or_dict)
    name = config.get("dtype") or config.get("torch_dtype")
    return name if isinstance(name, str) else None


def _check(condition: bool, family: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{family} config: {message} is not supported")


def _rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """transformers >= 5 writes rope_parameters; older configs have rope_theta and rope_scaling (whose
    type is `type` in DeepSeek's own configs) at the top level."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {})
    params = dict(params)
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def _rope(config: Mapping[str, Any], family: str, default_partial: float = 1.0) -> tuple[float, float]:
    """(rope theta, partial rotary factor); partial_rotary_factor may sit at the top level."""
    params = _rope_parameters(config)
    allowed = _ROPE_TYPES.get(family, ("default",))
    if config.get("rope_parameters") is None and config.get("rope_scaling") is not None:
        _check(params["rope_type"] in allowed, family, f"rope_scaling={config.get('rope_scaling')!r}")
    _check(params["rope_type"] in allowed, family, f"rope_type={params['rope_type']!r}")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", default_partial))
    return float(theta), float(partial)


def _no_attention_bias(config: Mapping[str, Any], family: str) -> None:
    _check(not config.get("attention_bias", False), family, "attention_bias=true")


# One entry per family: its own checks and the ModelArch fields its config sets beyond the common
# ones (arch_from_hf_config). Rotary: (theta, partial factor) from _rope.
def _llama(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    _no_attention_bias(config, family)
    _check(not config.get("mlp_bias", False), family, "mlp_bias=true")
    return {}


def _mistral(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    # HF Mistral masks keys more than sliding_window positions back; a window that covers every
    # position the model takes (Ministral-8B: 32768 of 32768) is full causal attention.
    window = config.get("sliding_window")
    _check(window is None or int(window) >= int(config["max_position_embeddings"]), family,
           f"sliding_window={window} (shorter than max_position_embeddings)")
    _check(not config.get("layer_types") or set(config["layer_types"]) == {"full_attention"}, family,
           "layer_types other than full_attention")
    return _llama(config, family)


def _qwen2(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    return dict(add_qkv_bias=True)


def _qwen3(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    _no_attention_bias(config, family)
    return dict(qk_layernorm=True)


def _qwen3_moe(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    _check(int(config.get("decoder_sparse_step", 1)) == 1, family, "decoder_sparse_step != 1")
    _check(not config.get("mlp_only_layers"), family, "mlp_only_layers (dense layers in a MoE model)")
    _check(not config.get("shared_expert_intermediate_size"), family, "shared experts")
    num_experts = config.get("num_experts", config.get("num_local_experts"))
    return dict(
        _qwen3(config, family),
        num_experts=int(num_experts),
        moe_router_topk=int(config["num_experts_per_tok"]),
        moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
        # HF: softmax over all experts, top-k, renormalise iff norm_topk_prob. Megatron without
        # pre-softmax takes softmax over the top-k logits, which is that renormalised top-k.
        moe_router_pre_softmax=not bool(config.get("norm_topk_prob", False)),
    )


def _mixtral(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    # transformers' Mixtral: softmax over all experts, top-k, always renormalised (modeling_mixtral.py
    # MixtralTopKRouter), i.e. Megatron's softmax over the top-k logits; each expert is intermediate_size wide.
    _check(not float(config.get("router_jitter_noise") or 0.0), family, "router_jitter_noise != 0")
    return dict(_mistral(config, family), num_experts=int(config["num_local_experts"]),
                moe_router_topk=int(config["num_experts_per_tok"]),
                moe_ffn_hidden_size=int(config["intermediate_size"]), moe_router_pre_softmax=False)


def _glm4(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    # transformers' Glm4: q/k/v biases, RoPE on the interleaved pairs of the first half of each head
    # (partial_rotary_factor defaults to 0.5, configuration_glm4.py), and an RMSNorm on the attention
    # and on the MLP output before each residual add (modeling_glm4.py Glm4DecoderLayer).
    return dict(add_qkv_bias=bool(config.get("attention_bias", True)), rotary_interleaved=True,
                post_self_attn_layernorm=True, post_mlp_layernorm=True)


def _deepseek_v3(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    # transformers' DeepseekV3 (modeling_deepseek_v3.py): MLA with RoPE on interleaved pairs, which
    # Megatron's MLA de-interleaves the same way (rope_utils.py _apply_rotary_pos_emb_bshd,
    # multi_latent_attention); YaRN; `first_k_dense_replace` dense layers, then MoE layers with shared
    # experts and a sigmoid router whose e_score_correction_bias only picks the top-k; group-limited
    # routing sums the top 2 scores of each group (DeepseekV3TopkRouter), Megatron the top
    # topk / group_topk (moe_utils.py group_limited_topk): equal when that is 2.
    _no_attention_bias(config, family)
    _check(config.get("rope_interleave", True), family, "rope_interleave=false")
    _check(config.get("scoring_func", "sigmoid") == "sigmoid", family, f"scoring_func={config.get('scoring_func')!r}")
    _check(config.get("topk_method", "noaux_tc") == "noaux_tc", family, f"topk_method={config.get('topk_method')!r}")
    _check(int(config.get("moe_layer_freq", 1)) == 1, family, "moe_layer_freq != 1")
    layers, dense = int(config["num_hidden_layers"]), int(config.get("first_k_dense_replace", 0))
    experts, topk = int(config["n_routed_experts"]), int(config["num_experts_per_tok"])
    # Megatron renormalises a sigmoid top-k (k > 1) always (moe_utils.py topk_routing_with_score_function)
    _check(bool(config.get("norm_topk_prob", True)) or topk == 1, family, "norm_topk_prob=false")
    groups, group_topk = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
    grouped = groups > 1 and group_topk < groups  # else every group is chosen: plain top-k
    _check(not grouped or topk == 2 * group_topk, family,
           f"group-limited routing with num_experts_per_tok={topk} != 2 x topk_group={group_topk}")
    params = _rope_parameters(config)
    yarn = params["rope_type"] == "yarn"
    shared = int(config.get("n_shared_experts") or 0)
    return dict(
        qk_layernorm=True, multi_latent_attention=True,
        q_lora_rank=int(config["q_lora_rank"]) if config.get("q_lora_rank") else None,
        kv_lora_rank=int(config["kv_lora_rank"]), qk_head_dim=int(config["qk_nope_head_dim"]),
        qk_pos_emb_head_dim=int(config["qk_rope_head_dim"]), v_head_dim=int(config["v_head_dim"]),
        kv_channels=int(config["v_head_dim"]),  # Megatron's core attention output per head
        rope_type="yarn" if yarn else "rope",
        **(dict(rotary_scaling_factor=float(params["factor"]),
                original_max_position_embeddings=int(params["original_max_position_embeddings"]),
                beta_fast=float(params.get("beta_fast", 32)), beta_slow=float(params.get("beta_slow", 1)),
                mscale=float(params.get("mscale", 1)), mscale_all_dim=float(params.get("mscale_all_dim", 0)))
           if yarn else {}),
        num_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
        moe_layer_freq=f"([0]*{dense}+[1]*{layers - dense})" if dense else "1",
        moe_shared_expert_intermediate_size=shared * int(config["moe_intermediate_size"]) if shared else None,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_num_groups=groups if grouped else None, moe_router_group_topk=group_topk if grouped else None,
        moe_router_topk_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
    )


def _glm4_moe(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    # transformers' Glm4Moe (modeling_glm4_moe.py): GQA attention, q/k/v biases if attention_bias, per-head
    # q/k RMSNorm if use_qk_norm, RoPE on the first partial_rotary_factor of each head by halves (rotate_half,
    # not glm4's interleaved pairs); first_k_dense_replace dense layers, then MoE layers with shared experts
    # and a sigmoid router (Glm4MoeTopkRouter) whose e_score_correction_bias only picks the top-k, the top-k
    # renormalised (norm_topk_prob: Megatron always renormalises a sigmoid top-k, moe_utils.py
    # topk_routing_with_score_function) and scaled by routed_scaling_factor. The MTP layers
    # (num_nextn_predict_layers) take no part in the log-probs: not loaded, trained or exported.
    groups, group_topk = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
    _check(group_topk >= groups, family, f"group-limited routing (n_group={groups}, topk_group={group_topk})")
    layers, dense = int(config["num_hidden_layers"]), int(config.get("first_k_dense_replace", 0))
    topk, shared = int(config["num_experts_per_tok"]), int(config.get("n_shared_experts") or 0)
    _check(bool(config.get("norm_topk_prob", True)) or topk == 1, family, "norm_topk_prob=false")
    return dict(
        add_qkv_bias=bool(config.get("attention_bias", False)), qk_layernorm=bool(config.get("use_qk_norm", False)),
        num_experts=int(config["n_routed_experts"]), moe_router_topk=topk,
        moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
        moe_layer_freq=f"([0]*{dense}+[1]*{layers - dense})" if dense else "1",
        moe_shared_expert_intermediate_size=shared * int(config["moe_intermediate_size"]) if shared else None,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_topk_scaling_factor=float(config.get("routed_scaling_factor") or 1.0))


_FAMILIES = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "mistral": _mistral,
             "glm4": _glm4, "deepseek_v3": _deepseek_v3, "mixtral": _mixtral, "glm4_moe": _glm4_moe}
_DEFAULT_PARTIAL_ROTARY = {"glm4": 0.5, "glm4_moe": 0.5}
_ROPE_TYPES = {"deepseek_v3": ("default", "yarn")}
SUPPORTED_HF_FAMILIES = tuple(_FAMILIES)


def arch_from_hf_config(path_or_dict: str | Path | Mapping[str, Any], make_vocab_size_divisible_by: int = 128,
                        seq_length: int | None = None) -> ModelArch:
    """ModelArch equal to the HF model (SUPPORTED_HF_FAMILIES). seq_length defaults to
    max_position_embeddings."""
    config = load_hf_config(path_or_dict)
    if config.get("model_type") in VLM_TEXT_FAMILIES:  # the language model's architecture (M-RoPE: vlm_model.py)
        config = text_config_of(config)
    family = hf_family(config)
    _check(config.get("hidden_act", "silu") == "silu", family, f"hidden_act={config.get('hidden_act')!r}")
    _check(not config.get("use_sliding_window", False), family, "use_sliding_window=true")
    theta, partial = _rope(config, family, _DEFAULT_PARTIAL_ROTARY.get(family, 1.0))
    own = _FAMILIES[family](config, family)
    _check(partial == 1.0 or family in _DEFAULT_PARTIAL_ROTARY, family, f"partial_rotary_factor={partial}")

    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = config.get("head_dim") or hidden // heads
    max_positions = int(config["max_position_embeddings"])
    return ModelArch(**{**dict(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        kv_channels=int(head_dim),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=max_positions,
        seq_length=seq_length if seq_length is not None else max_positions,
        normalization="RMSNorm",
        norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        swiglu=True,
        add_bias_linear=False,
        untie_embeddings_and_output_weights=not bool(config.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=theta,
        rotary_percent=partial,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
    ), **own})


# Ours to choose: they do not change what the checkpoint's weights compute.
_NOT_IN_CHECKPOINT = ("make_vocab_size_divisible_by", "seq_length", "attention_dropout", "hidden_dropout",
                      "moe_router_load_balancing_type", "moe_aux_loss_coeff")


def check_arch_matches_checkpoint(arch: ModelArch, checkpoint: str | Path | Mapping[str, Any]) -> None:
    """The model flags must describe the checkpoint's architecture exactly; raises naming each flag."""
    theirs = dataclasses.replace(arch_from_hf_config(checkpoint),
                                 **{name: getattr(arch, name) for name in _NOT_IN_CHECKPOINT})
    diffs = arch_differences(arch, theirs)
    if diffs:
        raise ConfigError(f"model flags disagree with the HF config of {checkpoint} (flags != checkpoint): "
                          + "; ".join(diffs))
