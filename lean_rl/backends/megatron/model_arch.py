"""The model architecture Megatron builds (`ModelArch`), validated on construction with messages that
name the flag, and Megatron's --moe-layer-freq as a per-layer pattern. Built from the HF config
(hf_config.py) or from the model flags (config.py: `ModelFlags.arch()`); nothing mutates it later.
Importing this module does not import Megatron."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lean_rl.options import ConfigError

NORMALIZATIONS = ("RMSNorm", "LayerNorm")
POSITION_EMBEDDINGS = ("rope",)
LOAD_BALANCING = ("none", "aux_loss", "seq_aux_loss")
ROPE_TYPES = ("rope", "yarn")
SCORE_FUNCTIONS = ("softmax", "sigmoid")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class ModelArch:
    """The model architecture. `vocab_size` is the real (tokenizer / HF) size; the padded size
    depends on TP and lives in MegatronConfig."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int  # == num_attention_heads unless --group-query-attention
    kv_channels: int  # head dim
    vocab_size: int
    max_position_embeddings: int
    seq_length: int
    # Defaults below are Megatron's, except dropout (0 for RL) and load balancing ("none"); the
    # flags (ModelFlags) take theirs from here.
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    swiglu: bool = False
    add_bias_linear: bool = True  # --disable-bias-linear sets False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    untie_embeddings_and_output_weights: bool = False
    position_embedding_type: str = "rope"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0  # the fraction of each head's dims that RoPE rotates (GLM-4: 0.5)
    rotary_interleaved: bool = False  # RoPE on (even, odd) dim pairs, not on the two halves (GLM-4)
    # Sandwich norms (GLM-4): an RMSNorm on the attention / MLP output before the residual add.
    post_self_attn_layernorm: bool = False
    post_mlp_layernorm: bool = False
    make_vocab_size_divisible_by: int = 128
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_router_pre_softmax: bool = False
    moe_router_load_balancing_type: str = "none"
    moe_aux_loss_coeff: float = 0.0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    # Multi-latent attention (DeepSeek-V3, Kimi-K2, Moonlight): Megatron's MLATransformerConfig fields.
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None  # None: one q projection (no low-rank q)
    kv_lora_rank: int = 32
    qk_head_dim: int = 128  # the no-RoPE part of a q / k head
    qk_pos_emb_head_dim: int = 64  # the RoPE part
    v_head_dim: int = 128
    rope_type: str = "rope"  # "yarn": YaRN-scaled RoPE (MLA only, as in Megatron)
    rotary_scaling_factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    # MoE beyond a softmax top-k router on every layer (DeepSeek-V3 / GLM-4.5 style)
    moe_layer_freq: str = "1"  # Megatron's --moe-layer-freq: N (every N-th layer) or "([0]*3+[1]*58)"
    moe_shared_expert_intermediate_size: int | None = None
    moe_router_score_function: str = "softmax"
    moe_router_enable_expert_bias: bool = False
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_topk_scaling_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                     "kv_channels", "vocab_size", "max_position_embeddings", "seq_length",
                     "make_vocab_size_divisible_by"):
            value = getattr(self, name)
            flag = "--" + name.replace("_", "-")  # each of these is declared on ModelFlags under its own name
            _require(isinstance(value, int) and value > 0, f"{flag} must be a positive integer, got {value!r}")
        _require(self.num_attention_heads % self.num_query_groups == 0,
                 f"--num-query-groups {self.num_query_groups} must divide "
                 f"--num-attention-heads {self.num_attention_heads}")
        _require(self.seq_length <= self.max_position_embeddings,
                 f"--seq-length {self.seq_length} exceeds --max-position-embeddings {self.max_position_embeddings}")
        _require(self.normalization in NORMALIZATIONS,
                 f"--normalization {self.normalization!r}: choose one of {', '.join(NORMALIZATIONS)}")
        _require(self.position_embedding_type in POSITION_EMBEDDINGS,
                 f"--position-embedding-type {self.position_embedding_type!r}: only "
                 f"{', '.join(POSITION_EMBEDDINGS)} is supported")
        _require(self.norm_epsilon > 0, f"--norm-epsilon must be > 0, got {self.norm_epsilon}")
        _require(self.rotary_base > 0, f"--rotary-base must be > 0, got {self.rotary_base}")
        _require(0 < self.rotary_percent <= 1, f"--rotary-percent must be in (0, 1], got {self.rotary_percent}")
        _require(self.moe_router_load_balancing_type in LOAD_BALANCING,
                 f"--moe-router-load-balancing-type {self.moe_router_load_balancing_type!r}: "
                 f"choose one of {', '.join(LOAD_BALANCING)}")
        _require(self.rope_type in ROPE_TYPES, f"--rope-type {self.rope_type!r}: choose one of {', '.join(ROPE_TYPES)}")
        _require(self.rope_type == "rope" or self.multi_latent_attention, "--rope-type yarn needs --multi-latent-attention")
        _require(self.moe_router_score_function in SCORE_FUNCTIONS,
                 f"--moe-router-score-function {self.moe_router_score_function!r}: "
                 f"choose one of {', '.join(SCORE_FUNCTIONS)}")
        pattern = moe_layer_pattern(self.moe_layer_freq, self.num_layers)  # raises naming the flag
        if self.num_experts is None:
            _require(self.moe_ffn_hidden_size is None, "--moe-ffn-hidden-size needs --num-experts")
            return
        _require(any(pattern), f"--moe-layer-freq {self.moe_layer_freq!r} leaves no MoE layer")
        if self.moe_router_group_topk is not None:
            _require(self.moe_router_num_groups is not None and self.num_experts % self.moe_router_num_groups == 0
                     and self.moe_router_topk % self.moe_router_group_topk == 0,
                     f"--moe-router-group-topk {self.moe_router_group_topk} needs --moe-router-num-groups dividing "
                     f"--num-experts and dividing --moe-router-topk")
        _require(self.num_experts > 0, f"--num-experts must be positive, got {self.num_experts}")
        _require(1 <= self.moe_router_topk <= self.num_experts,
                 f"--moe-router-topk {self.moe_router_topk} must be in [1, --num-experts {self.num_experts}]")
        _require(self.moe_ffn_hidden_size is not None and self.moe_ffn_hidden_size > 0,
                 "--moe-ffn-hidden-size must be set (positive) with --num-experts")

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer (0-based): is it an MoE layer (--num-experts and --moe-layer-freq)."""
        if not self.is_moe:
            return (False,) * self.num_layers
        return tuple(bool(x) for x in moe_layer_pattern(self.moe_layer_freq, self.num_layers))


def moe_layer_pattern(freq: str, num_layers: int) -> list[int]:
    """Megatron's --moe-layer-freq as a 0/1 list (moe_utils / arguments.py: an int N is an MoE layer
    every N layers from layer 0; a list expression such as "([0]*3+[1]*58)" gives each layer). Parsed
    here without eval: bracketed lists of 0/1, each optionally repeated by *N, joined by +."""
    text = str(freq).strip().strip("'\"")
    if text.isdigit():
        every = int(text)
        _require(every > 0, f"--moe-layer-freq must be positive, got {freq!r}")
        return [1 if i % every == 0 else 0 for i in range(num_layers)]
    inner = text[1:-1] if text.startswith("(") and text.endswith(")") else text
    out: list[int] = []
    for term in inner.replace(" ", "").split("+"):
        match = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*(\d+))?", term)
        _require(match is not None, f"--moe-layer-freq {freq!r}: expected N or a list such as ([0]*3+[1]*58)")
        assert match is not None
        out += [int(x) for x in match[1].split(",")] * int(match[2] or 1)
    _require(len(out) == num_layers, f"--moe-layer-freq {freq!r} gives {len(out)} layers, --num-layers is {num_layers}")
    return out
