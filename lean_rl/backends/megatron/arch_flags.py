"""Megatron architecture flags <-> HF config: the flags that reproduce an HF model (what
`--print-megatron-args` prints and scripts/models/*.sh hold), and the check that flags a user gave
agree with the HF config (an error names the flag, the given value and the HF value)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path
from typing import Any, Mapping

from lean_rl.backends.megatron.config import ModelFlags, ParallelConfig
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, hf_family, load_hf_config
from lean_rl.options import ConfigError, add_options, flag_of

# ModelArch fields a run chooses freely: they do not change what the checkpoint's weights compute.
FREE_FIELDS = ("make_vocab_size_divisible_by", "seq_length", "attention_dropout", "hidden_dropout",
               "moe_router_load_balancing_type", "moe_aux_loss_coeff")

# Where each ModelArch field comes from in an HF config (for error messages).
_HF_SOURCE = {
    "num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads", "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim", "vocab_size": "vocab_size", "max_position_embeddings": "max_position_embeddings",
    "norm_epsilon": "rms_norm_eps", "rotary_base": "rope_theta",
    "untie_embeddings_and_output_weights": "not tie_word_embeddings", "num_experts": "num_experts",
    "moe_router_topk": "num_experts_per_tok", "moe_ffn_hidden_size": "moe_intermediate_size",
    "moe_router_pre_softmax": "not norm_topk_prob",
    "rotary_percent": "partial_rotary_factor",
    # deepseek_v3
    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_head_dim": "qk_nope_head_dim",
    "qk_pos_emb_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim", "rope_type": "rope_scaling type",
    "rotary_scaling_factor": "rope_scaling factor", "moe_layer_freq": "first_k_dense_replace",
    "moe_shared_expert_intermediate_size": "n_shared_experts x moe_intermediate_size",
    "moe_router_num_groups": "n_group", "moe_router_group_topk": "topk_group",
    "moe_router_topk_scaling_factor": "routed_scaling_factor",
}


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    short = format(value, "g")
    return short if float(short) == value else repr(value)


# The fields `arch_flags` prints, in the order of scripts/models/*.sh (MoE ones for MoE models only).
_PRINTED = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
            "normalization", "norm_epsilon", "swiglu", "add_qkv_bias", "qk_layernorm",
            "untie_embeddings_and_output_weights", "add_bias_linear", "position_embedding_type", "rotary_base",
            "vocab_size", "max_position_embeddings")
# Printed only where they differ from Megatron's default (the families that need them).
_PRINTED_IF_SET = ("rotary_percent", "rotary_interleaved", "post_self_attn_layernorm", "post_mlp_layernorm",
                   "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                   "v_head_dim", "rope_type", "rotary_scaling_factor", "original_max_position_embeddings",
                   "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
_PRINTED_MOE = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax", "moe_layer_freq",
                "moe_shared_expert_intermediate_size", "moe_router_score_function", "moe_router_enable_expert_bias",
                "moe_router_num_groups", "moe_router_group_topk", "moe_router_topk_scaling_factor")


def arch_flags(arch: ModelArch) -> list[list[str]]:
    """Megatron flags (one flag and its value per entry) that give `arch` through
    ModelFlags.arch(); architecture only (no --seq-length, padding or dropout). A switch is
    printed when it changes its default."""
    defaults, flags = ModelFlags(), []
    optional = tuple(name for name in _PRINTED_IF_SET if getattr(arch, name) != getattr(defaults, name))
    moe = tuple(name for name in _PRINTED_MOE if name in _PRINTED_MOE[:4] or getattr(arch, name) != getattr(defaults, name))
    for name in _PRINTED + optional + (moe if arch.is_moe else ()):
        value, flag = getattr(arch, name), flag_of(ModelFlags, name)
        if isinstance(value, bool):
            if value != getattr(defaults, name):
                flags.append([flag])
        elif name == "num_query_groups":
            if value != arch.num_attention_heads:
                flags += [[flag_of(ModelFlags, "group_query_attention")], [flag, _number(value)]]
        else:
            flags.append([flag, value if isinstance(value, str) else _number(value)])
    return flags


def model_args_script(hf_dir_or_config: str | Path | Mapping[str, Any], title: str | None = None) -> str:
    """A bash snippet defining MODEL_ARGS=( ... ) for the HF model (the scripts/models/*.sh format)."""
    config = load_hf_config(hf_dir_or_config)
    arch = arch_from_hf_config(config)
    name = title or (str(hf_dir_or_config) if not isinstance(hf_dir_or_config, Mapping) else config["model_type"])
    lines = ["#!/bin/bash", f"# Megatron architecture flags for {name} ({hf_family(config)}), derived from its",
             "# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args",
             "MODEL_ARGS=("]
    lines += ["   " + " ".join(shlex.quote(part) for part in flag) for flag in arch_flags(arch)]
    return "\n".join(lines + [")"]) + "\n"


def given_model_flags_parser() -> argparse.ArgumentParser:
    """Megatron's model + parallel flags with every default suppressed: parsing gives only the flags
    that were actually typed (a flag given with its default value still counts as given), by dest
    (= field of ModelFlags / ParallelConfig: --disable-bias-linear gives add_bias_linear=False)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_options(parser, ModelFlags)
    add_options(parser, ParallelConfig)
    # set_defaults() would also store the sentinel as a parser-level default, which argparse then
    # type-converts; the actions' own defaults are what add_options set.
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return parser


def check_given_flags(given: Mapping[str, Any], hf_arch: ModelArch, source: str) -> ModelArch:
    """`given`: dest -> value of the Megatron model flags a user typed (given_model_flags_parser,
    without the parallel ones). Returns the architecture they describe on top of the HF-derived one
    (free fields such as --seq-length may differ); raises ConfigError naming every flag that
    contradicts the HF config."""
    # --seq-length follows --max-position-embeddings unless typed, as in the flags arch_flags prints.
    combined = dataclasses.replace(ModelFlags.of(hf_arch), **{"seq_length": None, **given}).arch()
    problems = []
    for field in ModelArch.__dataclass_fields__:
        ours, theirs = getattr(combined, field), getattr(hf_arch, field)
        if field in FREE_FIELDS or ours == theirs:
            continue
        origin = _HF_SOURCE.get(field, "model_type / family")
        problems.append(f"{flag_of(ModelFlags, field)} gives {field}={ours!r} but the HF config ({origin}) "
                        f"gives {theirs!r}")
    if problems:
        raise ConfigError(f"flags contradict the HF config of {source}: " + "; ".join(problems))
    return combined
