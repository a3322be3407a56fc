"""HF config.json -> ModelArch for the supported families. Anything the Megatron model or the weight
tables cannot reproduce exactly (sliding window, rope scaling, extra biases, dense layers inside a
MoE model...) is an error here, not a silent approximation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from lean_rl.backends.megatron.config import ModelArch, arch_differences
from lean_rl.options import ConfigError

SUPPORTED_HF_FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")


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


def hf_family(path_or_dict: str | Path | Mapping[str, Any]) -> str:
    """The weight-table family of an HF config: its `model_type`, if supported."""
    config = load_hf_config(path_or_dict)
    family = config.get("model_type")
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


def _rope_theta(config: Mapping[str, Any], family: str) -> float:
    # transformers >= 5 writes rope_parameters; older configs have rope_theta (+ rope_scaling).
    params = config.get("rope_parameters")
    if params is None:
        _check(config.get("rope_scaling") is None, family, f"rope_scaling={config.get('rope_scaling')!r}")
        return float(config.get("rope_theta", 10000.0))
    _check(params.get("rope_type", "default") == "default", family, f"rope_type={params.get('rope_type')!r}")
    _check(float(params.get("partial_rotary_factor", 1.0)) == 1.0, family, "partial_rotary_factor != 1")
    return float(params.get("rope_theta", 10000.0))


def arch_from_hf_config(path_or_dict: str | Path | Mapping[str, Any], make_vocab_size_divisible_by: int = 128,
                        seq_length: int | None = None) -> ModelArch:
    """ModelArch equal to the HF model (llama, qwen2, qwen3, qwen3_moe). seq_length defaults to
    max_position_embeddings."""
    config = load_hf_config(path_or_dict)
    family = hf_family(config)
    _check(config.get("hidden_act", "silu") == "silu", family, f"hidden_act={config.get('hidden_act')!r}")
    _check(not config.get("use_sliding_window", False), family, "use_sliding_window=true")
    _check(float(config.get("partial_rotary_factor", 1.0)) == 1.0, family, "partial_rotary_factor != 1")
    if family == "llama":
        _check(not config.get("attention_bias", False), family, "attention_bias=true")
        _check(not config.get("mlp_bias", False), family, "mlp_bias=true")
    if family in ("qwen3", "qwen3_moe"):
        _check(not config.get("attention_bias", False), family, "attention_bias=true")

    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = config.get("head_dim") or hidden // heads
    max_positions = int(config["max_position_embeddings"])
    moe: dict[str, Any] = {}
    if family == "qwen3_moe":
        _check(int(config.get("decoder_sparse_step", 1)) == 1, family, "decoder_sparse_step != 1")
        _check(not config.get("mlp_only_layers"), family, "mlp_only_layers (dense layers in a MoE model)")
        _check(not config.get("shared_expert_intermediate_size"), family, "shared experts")
        num_experts = config.get("num_experts", config.get("num_local_experts"))
        moe = dict(
            num_experts=int(num_experts),
            moe_router_topk=int(config["num_experts_per_tok"]),
            moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
            # HF: softmax over all experts, top-k, renormalise iff norm_topk_prob. Megatron without
            # pre-softmax takes softmax over the top-k logits, which is that renormalised top-k.
            moe_router_pre_softmax=not bool(config.get("norm_topk_prob", False)),
        )
    return ModelArch(
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
        add_qkv_bias=family == "qwen2",
        qk_layernorm=family in ("qwen3", "qwen3_moe"),
        untie_embeddings_and_output_weights=not bool(config.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=_rope_theta(config, family),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        **moe,
    )


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
