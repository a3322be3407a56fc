"""Typed, frozen configuration for the Megatron side, in Megatron's own vocabulary (flag names map
1:1 to fields: --num-query-groups -> num_query_groups). Each flag is declared once, on a field
(lean_rl/options.py): the model flags on `ModelFlags` (as typed; `ModelFlags.arch()` resolves them
into a `ModelArch`, model_arch.py), the parallel layout on `ParallelConfig`; `MegatronConfig` joins
them, validated on construction with messages that name the flag; nothing mutates it later.
Importing this module does not import Megatron."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lean_rl.backends.megatron.model_arch import (LOAD_BALANCING, NORMALIZATIONS, POSITION_EMBEDDINGS, ROPE_TYPES,
                                                SCORE_FUNCTIONS, ModelArch)
from lean_rl.options import ConfigError, flag_of, option

DISPATCHERS = ("allgather", "alltoall")
TRANSFORMER_IMPLS = ("transformer_engine", "local")
# The dtypes a trainer keeps its weights and computes in (Megatron's params_dtype); the optimizer's
# master weights and the reduced gradients are float32 in every case.
PARAMS_DTYPES = ("float32", "bfloat16", "float16")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


_ARCH_DEFAULT = {f.name: f.default for f in dataclasses.fields(ModelArch)}


@dataclass(frozen=True)
class ModelFlags:
    """The Megatron model flags as typed ("megatron model" in --help): None where not given, defaults
    those of ModelArch. `arch()` resolves them into a ModelArch the way Megatron does."""

    num_layers: int | None = option(None)
    hidden_size: int | None = option(None)
    ffn_hidden_size: int | None = option(None)
    num_attention_heads: int | None = option(None)
    group_query_attention: bool = option(False)
    num_query_groups: int | None = option(None)
    kv_channels: int | None = option(None, help="head dim; default hidden-size / num-attention-heads")
    normalization: str = option(_ARCH_DEFAULT["normalization"], choices=NORMALIZATIONS)
    norm_epsilon: float = option(_ARCH_DEFAULT["norm_epsilon"])
    swiglu: bool = option(_ARCH_DEFAULT["swiglu"])
    add_bias_linear: bool = option(_ARCH_DEFAULT["add_bias_linear"], flag="--disable-bias-linear")
    add_qkv_bias: bool = option(_ARCH_DEFAULT["add_qkv_bias"])
    qk_layernorm: bool = option(_ARCH_DEFAULT["qk_layernorm"])
    untie_embeddings_and_output_weights: bool = option(_ARCH_DEFAULT["untie_embeddings_and_output_weights"])
    position_embedding_type: str = option(_ARCH_DEFAULT["position_embedding_type"], choices=POSITION_EMBEDDINGS)
    rotary_base: float = option(_ARCH_DEFAULT["rotary_base"])
    rotary_percent: float = option(_ARCH_DEFAULT["rotary_percent"], help="fraction of the head dim RoPE rotates")
    rotary_interleaved: bool = option(_ARCH_DEFAULT["rotary_interleaved"],
                                      help="RoPE rotates (even, odd) dim pairs instead of the two halves")
    post_self_attn_layernorm: bool = option(_ARCH_DEFAULT["post_self_attn_layernorm"],
                                            help="an RMSNorm on the attention output before the residual add")
    post_mlp_layernorm: bool = option(_ARCH_DEFAULT["post_mlp_layernorm"],
                                      help="an RMSNorm on the MLP output before the residual add")
    vocab_size: int | None = option(None, help="the real (tokenizer) vocab size; padding is derived")
    make_vocab_size_divisible_by: int = option(_ARCH_DEFAULT["make_vocab_size_divisible_by"])
    seq_length: int | None = option(None)
    max_position_embeddings: int | None = option(None)
    attention_dropout: float = option(_ARCH_DEFAULT["attention_dropout"])
    hidden_dropout: float = option(_ARCH_DEFAULT["hidden_dropout"])
    num_experts: int | None = option(_ARCH_DEFAULT["num_experts"])
    moe_router_topk: int = option(_ARCH_DEFAULT["moe_router_topk"])
    moe_ffn_hidden_size: int | None = option(_ARCH_DEFAULT["moe_ffn_hidden_size"])
    moe_router_pre_softmax: bool = option(_ARCH_DEFAULT["moe_router_pre_softmax"])
    moe_router_load_balancing_type: str = option(_ARCH_DEFAULT["moe_router_load_balancing_type"],
                                                 choices=LOAD_BALANCING)
    moe_aux_loss_coeff: float = option(_ARCH_DEFAULT["moe_aux_loss_coeff"])
    multi_latent_attention: bool = option(_ARCH_DEFAULT["multi_latent_attention"],
                                          help="multi-latent attention (DeepSeek-V3, Kimi-K2, Moonlight)")
    q_lora_rank: int | None = option(_ARCH_DEFAULT["q_lora_rank"], help="MLA: low-rank q; unset: one q projection")
    kv_lora_rank: int = option(_ARCH_DEFAULT["kv_lora_rank"])
    qk_head_dim: int = option(_ARCH_DEFAULT["qk_head_dim"], help="MLA: the no-RoPE part of a q / k head")
    qk_pos_emb_head_dim: int = option(_ARCH_DEFAULT["qk_pos_emb_head_dim"], help="MLA: the RoPE part of a q / k head")
    v_head_dim: int = option(_ARCH_DEFAULT["v_head_dim"])
    rope_type: str = option(_ARCH_DEFAULT["rope_type"], choices=ROPE_TYPES)
    rotary_scaling_factor: float = option(_ARCH_DEFAULT["rotary_scaling_factor"], help="YaRN factor")
    original_max_position_embeddings: int = option(_ARCH_DEFAULT["original_max_position_embeddings"])
    beta_fast: float = option(_ARCH_DEFAULT["beta_fast"])
    beta_slow: float = option(_ARCH_DEFAULT["beta_slow"])
    mscale: float = option(_ARCH_DEFAULT["mscale"])
    mscale_all_dim: float = option(_ARCH_DEFAULT["mscale_all_dim"])
    moe_layer_freq: str = option(_ARCH_DEFAULT["moe_layer_freq"],
                                 help="N: an MoE layer every N layers; or a list such as ([0]*3+[1]*58)")
    moe_shared_expert_intermediate_size: int | None = option(_ARCH_DEFAULT["moe_shared_expert_intermediate_size"])
    moe_router_score_function: str = option(_ARCH_DEFAULT["moe_router_score_function"], choices=SCORE_FUNCTIONS)
    moe_router_enable_expert_bias: bool = option(
        _ARCH_DEFAULT["moe_router_enable_expert_bias"],
        help="a per-expert bias added to the scores for the top-k choice only (DeepSeek-V3); lean_rl keeps it "
             "as the checkpoint has it (no bias update)")
    moe_router_num_groups: int | None = option(_ARCH_DEFAULT["moe_router_num_groups"])
    moe_router_group_topk: int | None = option(_ARCH_DEFAULT["moe_router_group_topk"])
    moe_router_topk_scaling_factor: float | None = option(_ARCH_DEFAULT["moe_router_topk_scaling_factor"])
    # Not architecture (ModelArch has no such field, arch() ignores them): MegatronConfig takes them.
    transformer_impl: str = option(
        "transformer_engine", choices=TRANSFORMER_IMPLS,
        help="layer spec, as Megatron's flag: transformer_engine (used when TransformerEngine and a GPU are "
             "there; else local) or local (Megatron's own layers, e.g. for --lora-rank, which adapts those)")
    use_rollout_routing_replay: bool = option(
        False, help="MoE: rollout routing replay (R3): the engines return the experts they routed every token "
                    "to, and the trainer's routers use those in every forward and backward (log-probs and "
                    "training), so the policy trained is the one that sampled; tokens the engine never took as "
                    "input are routed by the trainer. Logs train/routing_mismatch_frac (routes the trainer "
                    "would have chosen otherwise)")
    # vision-language checkpoints (issue 44; vlm_model.py)
    freeze_vision_tower: bool = option(
        False, help="vision-language model (--hf-checkpoint a Qwen2.5-VL): the vision tower gets no gradient and "
                    "keeps the checkpoint's weights; the language model trains")

    def arch(self) -> ModelArch:
        """Megatron's derivations: --num-query-groups only with --group-query-attention (else one
        group per head), --kv-channels defaults to hidden / heads, --seq-length and
        --max-position-embeddings default to each other."""
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"):
            _require(getattr(self, name) is not None, f"{_flag(name)} is required")
        _require(self.seq_length is not None or self.max_position_embeddings is not None,
                 "--seq-length or --max-position-embeddings is required")
        if self.num_query_groups is not None:
            _require(self.group_query_attention, "--num-query-groups needs --group-query-attention")
        if self.group_query_attention:
            _require(self.num_query_groups is not None, "--group-query-attention needs --num-query-groups")
        if self.kv_channels is None:
            _require(self.hidden_size % self.num_attention_heads == 0,
                     f"--num-attention-heads {self.num_attention_heads} must divide --hidden-size {self.hidden_size} "
                     "unless --kv-channels is given")
        seq_length = self.seq_length if self.seq_length is not None else self.max_position_embeddings
        max_positions = self.max_position_embeddings if self.max_position_embeddings is not None else seq_length
        head_dim = self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads
        derived = dict(
            num_query_groups=self.num_query_groups if self.group_query_attention else self.num_attention_heads,
            kv_channels=head_dim, max_position_embeddings=max_positions, seq_length=seq_length)
        given = {name: getattr(self, name) for name in _ARCH_DEFAULT if name not in derived}
        return ModelArch(**given, **derived)

    @classmethod
    def of(cls, arch: ModelArch) -> ModelFlags:
        """The flags that give `arch` (`ModelFlags.of(a).arch() == a`)."""
        grouped = arch.num_query_groups != arch.num_attention_heads
        same = {name: getattr(arch, name) for name in _ARCH_DEFAULT if name != "num_query_groups"}
        return cls(**same, group_query_attention=grouped, num_query_groups=arch.num_query_groups if grouped else None)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_model_parallel_size: int = option(1)
    pipeline_model_parallel_size: int = option(1)
    expert_model_parallel_size: int = option(1)
    sequence_parallel: bool = option(False)
    moe_token_dispatcher_type: str = option("allgather", choices=DISPATCHERS)

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{_flag(name)} must be a positive integer, got {value!r}")
        _require(not self.sequence_parallel or self.tensor_model_parallel_size > 1,
                 "--sequence-parallel needs --tensor-model-parallel-size > 1")
        _require(self.moe_token_dispatcher_type in DISPATCHERS,
                 f"--moe-token-dispatcher-type {self.moe_token_dispatcher_type!r}: "
                 f"choose one of {', '.join(DISPATCHERS)}")

    @property
    def expert_tensor_parallel_size(self) -> int:
        """Megatron's default (model_parallel_config.py:413): experts use the dense TP size."""
        return self.tensor_model_parallel_size

    @property
    def min_world_size(self) -> int:
        """Smallest world: within a pipeline stage, TP x DP ranks must hold ETP x EP, so DP >= EP."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.expert_model_parallel_size

    def data_parallel_size(self, world_size: int) -> int:
        model_parallel = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        _require(world_size > 0 and world_size % model_parallel == 0,
                 f"world size {world_size} must be a multiple of --tensor-model-parallel-size x "
                 f"--pipeline-model-parallel-size = {model_parallel}")
        data_parallel = world_size // model_parallel
        _require(data_parallel % self.expert_model_parallel_size == 0,
                 f"--expert-model-parallel-size {self.expert_model_parallel_size} must divide the data-parallel "
                 f"size {data_parallel} (world size {world_size})")
        return data_parallel


@dataclass(frozen=True)
class PrecisionFlags:
    """Megatron's mixed-precision switches. Neither given: float32 on CPU; on GPU 16-bit whatever the
    checkpoint's dtype: a float16 checkpoint trains in float16, any other (bfloat16, float32,
    undeclared) in bfloat16, as slime's GPU scripts run (--bf16). Not float32 on GPU: SGLang's default
    attention backend on Hopper (FA3) has no float32 kernels, and TransformerEngine's float32 GEMMs run
    in TF32 anyway (review 2026-12-06 N1)."""

    bf16: bool = option(False, help="train in bfloat16: weights and compute in bf16, float32 master weights and "
                                    "gradients in the optimizer (Megatron's --bf16). Default: float32 on CPU; on GPU "
                                    "bfloat16 (float16 for a float16 checkpoint), whatever the checkpoint's dtype")
    fp16: bool = option(False, help="train in float16 with float32 master weights and dynamic loss scaling "
                                    "(Megatron's --fp16); a step whose scaled gradients overflow is skipped and "
                                    "counted")

    def params_dtype(self, device: str, checkpoint_dtype: str | None) -> str:
        """The trainer's dtype: the flag, else the default for `device` (see the class docstring)."""
        _require(not (self.bf16 and self.fp16), "--bf16 and --fp16 exclude each other")
        if self.bf16:
            return "bfloat16"
        if self.fp16:
            return "float16"
        if device == "cuda":
            return "float16" if checkpoint_dtype == "float16" else "bfloat16"
        return "float32"


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int, tensor_model_parallel_size: int) -> int:
    """The one place vocab padding is computed. Megatron's GPTModel does not pad: the embedding and
    output layer need a row count divisible by TP (and, for speed, by --make-vocab-size-divisible-by)."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class MegatronConfig:
    """Architecture + parallel layout, cross-validated; `padded_vocab_size` is computed from them."""

    arch: ModelArch
    parallel: ParallelConfig
    use_rollout_routing_replay: bool = False  # --use-rollout-routing-replay (routing_replay.py)
    params_dtype: str = "float32"  # PrecisionFlags.params_dtype: the weights' and the compute's dtype
    transformer_impl: str = "transformer_engine"  # --transformer-impl (compat.uses_te_layer_spec)
    # a vision-language checkpoint's config.json (vlm_family.VLM_FAMILIES): the ranks build
    # VisionLanguageModel (vlm_model.py) instead of a GPTModel; None for text models
    vlm_hf_config: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    freeze_vision_tower: bool = False  # --freeze-vision-tower

    def __post_init__(self) -> None:
        arch, par = self.arch, self.parallel
        _require(self.transformer_impl in TRANSFORMER_IMPLS,
                 f"--transformer-impl {self.transformer_impl!r}: choose one of {', '.join(TRANSFORMER_IMPLS)}")
        _require(self.params_dtype in PARAMS_DTYPES,
                 f"trainer dtype {self.params_dtype!r}: choose one of {', '.join(PARAMS_DTYPES)} (--bf16 / --fp16)")
        tp, pp, ep = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.expert_model_parallel_size
        _require(arch.num_attention_heads % tp == 0,
                 f"--tensor-model-parallel-size {tp} must divide --num-attention-heads {arch.num_attention_heads}")
        _require(arch.num_query_groups % tp == 0,
                 f"--tensor-model-parallel-size {tp} must divide --num-query-groups {arch.num_query_groups}")
        _require(arch.ffn_hidden_size % tp == 0,
                 f"--tensor-model-parallel-size {tp} must divide --ffn-hidden-size {arch.ffn_hidden_size}")
        _require(arch.num_layers % pp == 0,
                 f"--pipeline-model-parallel-size {pp} must divide --num-layers {arch.num_layers}")
        if arch.is_moe:
            _require(arch.num_experts % ep == 0,
                     f"--expert-model-parallel-size {ep} must divide --num-experts {arch.num_experts}")
            _require(arch.moe_ffn_hidden_size % par.expert_tensor_parallel_size == 0,
                     f"--tensor-model-parallel-size {tp} (the expert TP size) must divide "
                     f"--moe-ffn-hidden-size {arch.moe_ffn_hidden_size}")
            _require(tp == 1 or par.sequence_parallel,
                     "--sequence-parallel is required for MoE with --tensor-model-parallel-size > 1")
        else:
            _require(ep == 1, "--expert-model-parallel-size > 1 needs --num-experts")
            _require(not self.use_rollout_routing_replay,
                     "--use-rollout-routing-replay needs an MoE model (--num-experts): this one has no MoE layer, "
                     "so there are no routes to replay")

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary padded as Megatron pads it (a pure function of the arch and the TP size)."""
        arch = self.arch
        return padded_vocab_size(arch.vocab_size, arch.make_vocab_size_divisible_by,
                                 self.parallel.tensor_model_parallel_size)


def _flag(field_name: str) -> str:
    """The flag that sets a ModelArch / ParallelConfig field (for messages)."""
    return flag_of(ParallelConfig if field_name in ParallelConfig.__dataclass_fields__ else ModelFlags, field_name)


def arch_differences(expected: ModelArch, actual: ModelArch) -> list[str]:
    """Flags whose values differ, as '--flag: a != b' (for 'flags disagree with the checkpoint')."""
    out = []
    for name in expected.__dataclass_fields__:
        a, b = getattr(expected, name), getattr(actual, name)
        if a != b:
            inverted = " (inverted)" if ModelFlags.__dataclass_fields__[name].default is True else ""
            out.append(f"{_flag(name)}{inverted}: {a!r} != {b!r}")
    return out
