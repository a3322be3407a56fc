"""The HF <-> Megatron weight tables, one per family: the single source of truth for loading HF
checkpoints, exporting HF-named tensors (weight sync to SGLang) and checkpoint conversion.

Megatron names are the local-spec parameter names of GPTModel with `{layer}` the global layer index
and `{expert}` the global expert index; HF names use the same indices. The TE layer spec fuses the
two pre-norms into the following linear; `canonical_megatron_name` maps those names back."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import SUPPORTED_HF_FAMILIES
from lean_rl.backends.megatron.hf_weights.layouts import Geometry, Layout


@dataclass(frozen=True)
class WeightRule:
    megatron: str  # parameter-name template
    hf: tuple[str, ...]  # HF tensor-name templates, in the order the layout expects
    layout: Layout
    exported: bool = True  # False: HF does not store it separately (tied output layer)
    layers: str = "all"  # "dense" / "moe": only in those layers (ModelArch.moe_layers)
    only_if: str = ""  # a ModelArch field that must be set for the rule to exist (q_lora_rank)

    @property
    def per_expert(self) -> bool:
        return "{expert}" in self.megatron

    @cached_property
    def pattern(self) -> re.Pattern:
        regex = re.escape(self.megatron).replace(r"\{layer\}", r"(?P<layer>\d+)")
        return re.compile(regex.replace(r"\{expert\}", r"(?P<expert>\d+)") + "$")

    def hf_names(self, layer: int | None = None, expert: int | None = None) -> tuple[str, ...]:
        return tuple(name.format(layer=layer, expert=expert) for name in self.hf)

    def megatron_name(self, layer: int | None = None, expert: int | None = None) -> str:
        return self.megatron.format(layer=layer, expert=expert)


_M, _H = "decoder.layers.{layer}.", "model.layers.{layer}."
_EMBEDDING = WeightRule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), Layout.VOCAB)
_FINAL_NORM = WeightRule("decoder.final_layernorm.weight", ("model.norm.weight",), Layout.REPLICATED)
_OUTPUT = WeightRule("output_layer.weight", ("lm_head.weight",), Layout.VOCAB)
# Tied: the last stage may still hold its own output_layer copy (PP > 1); HF keeps only embed_tokens.
_TIED_OUTPUT = WeightRule("output_layer.weight", ("model.embed_tokens.weight",), Layout.VOCAB, exported=False)

_ATTENTION = (
    WeightRule(_M + "input_layernorm.weight", (_H + "input_layernorm.weight",), Layout.REPLICATED),
    WeightRule(_M + "self_attention.linear_qkv.weight",
               (_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight", _H + "self_attn.v_proj.weight"),
               Layout.QKV),
    WeightRule(_M + "self_attention.linear_proj.weight", (_H + "self_attn.o_proj.weight",), Layout.ROW),
    WeightRule(_M + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",), Layout.REPLICATED),
)
_QKV_BIAS = (
    WeightRule(_M + "self_attention.linear_qkv.bias",
               (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"),
               Layout.QKV),
)
_QK_NORM = (
    WeightRule(_M + "self_attention.q_layernorm.weight", (_H + "self_attn.q_norm.weight",), Layout.REPLICATED),
    WeightRule(_M + "self_attention.k_layernorm.weight", (_H + "self_attn.k_norm.weight",), Layout.REPLICATED),
)
_DENSE_MLP = (
    WeightRule(_M + "mlp.linear_fc1.weight", (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"),
               Layout.GATE_UP),
    WeightRule(_M + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",), Layout.ROW),
)
_E = _M + "mlp.experts.local_experts.{expert}."
_MOE_MLP = (
    WeightRule(_M + "mlp.router.weight", (_H + "mlp.gate.weight",), Layout.REPLICATED),
    WeightRule(_E + "linear_fc1.weight",
               (_H + "mlp.experts.{expert}.gate_proj.weight", _H + "mlp.experts.{expert}.up_proj.weight"),
               Layout.GATE_UP),
    WeightRule(_E + "linear_fc2.weight", (_H + "mlp.experts.{expert}.down_proj.weight",), Layout.ROW),
)
# Mixtral: the same MoE under block_sparse_moe, experts' gate / down / up as w1 / w2 / w3.
_MIXTRAL_MOE = (
    WeightRule(_M + "mlp.router.weight", (_H + "block_sparse_moe.gate.weight",), Layout.REPLICATED),
    WeightRule(_E + "linear_fc1.weight", (_H + "block_sparse_moe.experts.{expert}.w1.weight",
                                          _H + "block_sparse_moe.experts.{expert}.w3.weight"), Layout.GATE_UP),
    WeightRule(_E + "linear_fc2.weight", (_H + "block_sparse_moe.experts.{expert}.w2.weight",), Layout.ROW),
)

# GLM-4 (transformers' Glm4): sandwich norms (post_attention_layernorm is the pre-MLP norm, as in
# llama) and one fused [gate; up] tensor; the post norms are modules of post_norms.py.
_GLM4_LAYER = (
    WeightRule(_M + "self_attention.post_self_attn_layernorm.weight", (_H + "post_self_attn_layernorm.weight",),
               Layout.REPLICATED),
    WeightRule(_M + "mlp.linear_fc1.weight", (_H + "mlp.gate_up_proj.weight",), Layout.GATE_UP_FUSED),
    WeightRule(_M + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",), Layout.ROW),
    WeightRule(_M + "mlp.post_mlp_layernorm.weight", (_H + "post_mlp_layernorm.weight",), Layout.REPLICATED),
)

# DeepSeek-V3 (transformers' DeepseekV3, Megatron's MLASelfAttention with the local spec): low-rank q
# (q_a_proj, its norm, q_b_proj) or one q_proj; the joint k/v down projection [latent; k_rope] and its
# norm on the latent; the up projection, per head [k_nope; v]. The local spec's down projections are
# column-parallel (gathered in the forward, multi_latent_attention.py:600), the up projections split by
# head. Dense layers first, then MoE layers: sigmoid router with its expert bias (a buffer), routed
# experts and the shared experts (one MLP of n_shared x moe_intermediate_size).
_DS = _H + "self_attn."
_MLA = (
    WeightRule(_M + "input_layernorm.weight", (_H + "input_layernorm.weight",), Layout.REPLICATED),
    WeightRule(_M + "self_attention.linear_q_down_proj.weight", (_DS + "q_a_proj.weight",), Layout.COLUMN,
               only_if="q_lora_rank"),
    WeightRule(_M + "self_attention.q_layernorm.weight", (_DS + "q_a_layernorm.weight",), Layout.REPLICATED,
               only_if="q_lora_rank"),
    WeightRule(_M + "self_attention.linear_q_up_proj.weight", (_DS + "q_b_proj.weight",), Layout.COLUMN,
               only_if="q_lora_rank"),
    WeightRule(_M + "self_attention.linear_q_proj.weight", (_DS + "q_proj.weight",), Layout.COLUMN,
               only_if="not q_lora_rank"),
    WeightRule(_M + "self_attention.linear_kv_down_proj.weight", (_DS + "kv_a_proj_with_mqa.weight",), Layout.COLUMN),
    WeightRule(_M + "self_attention.kv_layernorm.weight", (_DS + "kv_a_layernorm.weight",), Layout.REPLICATED),
    WeightRule(_M + "self_attention.linear_kv_up_proj.weight", (_DS + "kv_b_proj.weight",), Layout.COLUMN),
    WeightRule(_M + "self_attention.linear_proj.weight", (_DS + "o_proj.weight",), Layout.ROW),
    WeightRule(_M + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",), Layout.REPLICATED),
)
_S = _M + "mlp.shared_experts."
_DEEPSEEK_MLP = tuple(WeightRule(r.megatron, r.hf, r.layout, layers="dense") for r in _DENSE_MLP) + tuple(
    WeightRule(r.megatron, r.hf, r.layout, layers="moe") for r in _MOE_MLP + (
        WeightRule(_M + "mlp.router.expert_bias", (_H + "mlp.gate.e_score_correction_bias",), Layout.REPLICATED),
        WeightRule(_S + "linear_fc1.weight",
                   (_H + "mlp.shared_experts.gate_proj.weight", _H + "mlp.shared_experts.up_proj.weight"),
                   Layout.GATE_UP),
        WeightRule(_S + "linear_fc2.weight", (_H + "mlp.shared_experts.down_proj.weight",), Layout.ROW)))

# GLM-4.5 (transformers' Glm4Moe): llama-style GQA attention whose q/k/v biases (attention_bias) and
# per-head q/k norms (use_qk_norm) each a checkpoint may or may not have, then DeepSeek-V3's MLP layers.
_GLM4_MOE_ATTENTION = _ATTENTION + tuple(dataclasses.replace(r, only_if="add_qkv_bias") for r in _QKV_BIAS) + tuple(
    dataclasses.replace(r, only_if="qk_layernorm") for r in _QK_NORM)

# One entry per family: its layer rules, and what they assume about the architecture (field ->
# required value, on top of _COMMON_ARCH).
_DENSE = dict(is_moe=False)
FAMILY_TABLES: dict[str, tuple[tuple[WeightRule, ...], dict[str, object]]] = {
    "llama": (_ATTENTION + _DENSE_MLP, dict(_DENSE, add_qkv_bias=False, qk_layernorm=False)),
    "mistral": (_ATTENTION + _DENSE_MLP, dict(_DENSE, add_qkv_bias=False, qk_layernorm=False)),
    "qwen2": (_ATTENTION + _QKV_BIAS + _DENSE_MLP, dict(_DENSE, add_qkv_bias=True, qk_layernorm=False)),
    "qwen3": (_ATTENTION + _QK_NORM + _DENSE_MLP, dict(_DENSE, add_qkv_bias=False, qk_layernorm=True)),
    "qwen3_moe": (_ATTENTION + _QK_NORM + _MOE_MLP, dict(add_qkv_bias=False, qk_layernorm=True, is_moe=True)),
    "glm4": (_ATTENTION + _QKV_BIAS + _GLM4_LAYER,
             dict(_DENSE, add_qkv_bias=True, qk_layernorm=False, post_self_attn_layernorm=True,
                  post_mlp_layernorm=True)),
    "deepseek_v3": (_MLA + _DEEPSEEK_MLP,
                    dict(add_qkv_bias=False, qk_layernorm=True, is_moe=True, multi_latent_attention=True,
                         moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)),
    "mixtral": (_ATTENTION + _MIXTRAL_MOE, dict(add_qkv_bias=False, qk_layernorm=False, is_moe=True)),
    "glm4_moe": (_GLM4_MOE_ATTENTION + _DEEPSEEK_MLP,
                 dict(is_moe=True, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)),
}
LAYER_RULES = {family: rules for family, (rules, _) in FAMILY_TABLES.items()}
_COMMON_ARCH = dict(normalization="RMSNorm", swiglu=True, add_bias_linear=False, position_embedding_type="rope",
                    post_self_attn_layernorm=False, post_mlp_layernorm=False, multi_latent_attention=False,
                    moe_router_score_function="softmax", moe_router_enable_expert_bias=False)


def weight_rules(family: str, arch: ModelArch) -> tuple[WeightRule, ...]:
    """The full table for `family`, after checking that `arch` is what the table maps."""
    if family not in FAMILY_TABLES:
        raise ValueError(f"HF family {family!r} has no weight table; supported: {', '.join(SUPPORTED_HF_FAMILIES)}")
    wrong = [f"{name}={getattr(arch, name)!r} (needs {value!r})"
             for name, value in {**_COMMON_ARCH, **FAMILY_TABLES[family][1]}.items() if getattr(arch, name) != value]
    if wrong:
        raise ValueError(f"the {family} weight table cannot map this architecture: {', '.join(wrong)}")
    output = _OUTPUT if arch.untie_embeddings_and_output_weights else _TIED_OUTPUT
    return (_EMBEDDING, *(r for r in LAYER_RULES[family] if _exists(r, arch)), _FINAL_NORM, output)


def _exists(rule: WeightRule, arch: ModelArch) -> bool:
    if not rule.only_if:
        return True
    negated, name = rule.only_if.startswith("not "), rule.only_if.removeprefix("not ")
    return bool(getattr(arch, name)) != negated


def in_layer(rule: WeightRule, arch: ModelArch, layer: int) -> bool:
    """Whether layer `layer` (0-based, global) has the rule's parameter (dense / MoE layers)."""
    return rule.layers == "all" or (rule.layers == "moe") == arch.moe_layers[layer]


def lora_hf_modules_differ(family: str, targets: dict[str, tuple[str, ...]]) -> str | None:
    """Why engines cannot serve a LoRA adapter of `family` apart from its base under the HF module
    names `targets` (Megatron target -> HF modules) announce, or None: e.g. GLM-4 stores its MLP's
    gate and up as one gate_up_proj."""
    for target, modules in targets.items():
        dense = [r for r in LAYER_RULES[family] if r.megatron.endswith(f".{target}.weight") and not r.per_expert]
        theirs = tuple(name.split(".")[-2] for name in dense[0].hf) if dense else modules
        if theirs != modules:
            return f"a {family} model ({target} is HF {', '.join(theirs)}, not {', '.join(modules)})"
    return None


def geometry(config: MegatronConfig) -> Geometry:
    arch = config.arch
    return Geometry(num_query_groups=arch.num_query_groups,
                    heads_per_group=arch.num_attention_heads // arch.num_query_groups,
                    head_dim=arch.kv_channels, vocab_size=arch.vocab_size,
                    padded_vocab_size=config.padded_vocab_size)


def rule_instances(rules: tuple[WeightRule, ...], arch: ModelArch) -> Iterator[tuple[WeightRule, dict[str, int]]]:
    """Every (rule, {layer, expert}) of the whole model, in global indices."""
    for rule in rules:
        if "{layer}" not in rule.megatron:
            yield rule, {}
            continue
        for layer in range(arch.num_layers):
            if not in_layer(rule, arch, layer):
                continue
            if rule.per_expert:
                for expert in range(arch.num_experts):
                    yield rule, {"layer": layer, "expert": expert}
            else:
                yield rule, {"layer": layer}


# TE layer spec (megatron-core 0.16.1 gpt_layer_specs.py:279 linear_qkv, :496 dense linear_fc1):
# TELayerNormColumnParallelLinear owns the pre-attention norm, and for dense MLPs the pre-MLP norm,
# as `layer_norm_weight`. MoE layers keep a separate pre_mlp_layernorm (gpt_layer_specs.py:291).
_TE_ALIASES = (
    (re.compile(r"\.self_attention\.linear_qkv\.layer_norm_weight$"), ".input_layernorm.weight"),
    (re.compile(r"\.mlp\.linear_fc1\.layer_norm_weight$"), ".pre_mlp_layernorm.weight"),
    # MLA (gpt_layer_specs.py:233): the q and kv latent norms fused into the up projections
    (re.compile(r"\.self_attention\.linear_q_up_proj\.layer_norm_weight$"), ".self_attention.q_layernorm.weight"),
    (re.compile(r"\.self_attention\.linear_kv_up_proj\.layer_norm_weight$"), ".self_attention.kv_layernorm.weight"),
)


def canonical_megatron_name(name: str) -> str:
    """A GPTModel parameter name as the tables spell it (local spec), whichever spec built it."""
    for pattern, replacement in _TE_ALIASES:
        name = pattern.sub(replacement, name)
    return name
