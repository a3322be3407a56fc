"""Typed, frozen configuration for the Megatron side, in Megatron's own vocabulary (flag names map
1:1 to fields: --num-query-groups -> num_query_groups). Built once from argparse or from an HF config
(hf_config.py), validated on construction with messages that name the flag; nothing mutates it later.
Importing this module does not import Megatron."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

NORMALIZATIONS = ("RMSNorm", "LayerNorm")
POSITION_EMBEDDINGS = ("rope",)
DISPATCHERS = ("allgather", "alltoall")
LOAD_BALANCING = ("none", "aux_loss", "seq_aux_loss")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag."""


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
    # Defaults below are Megatron's, except dropout (0 for RL) and load balancing ("none").
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    swiglu: bool = False
    add_bias_linear: bool = True  # --disable-bias-linear sets False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    untie_embeddings_and_output_weights: bool = False
    position_embedding_type: str = "rope"
    rotary_base: float = 10000.0
    make_vocab_size_divisible_by: int = 128
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_router_pre_softmax: bool = False
    moe_router_load_balancing_type: str = "none"
    moe_aux_loss_coeff: float = 0.0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                     "kv_channels", "vocab_size", "max_position_embeddings", "seq_length",
                     "make_vocab_size_divisible_by"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"--{_flag(name)} must be a positive integer, got {value!r}")
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
        _require(self.moe_router_load_balancing_type in LOAD_BALANCING,
                 f"--moe-router-load-balancing-type {self.moe_router_load_balancing_type!r}: "
                 f"choose one of {', '.join(LOAD_BALANCING)}")
        if self.num_experts is None:
            _require(self.moe_ffn_hidden_size is None, "--moe-ffn-hidden-size needs --num-experts")
            return
        _require(self.num_experts > 0, f"--num-experts must be positive, got {self.num_experts}")
        _require(1 <= self.moe_router_topk <= self.num_experts,
                 f"--moe-router-topk {self.moe_router_topk} must be in [1, --num-experts {self.num_experts}]")
        _require(self.moe_ffn_hidden_size is not None and self.moe_ffn_hidden_size > 0,
                 "--moe-ffn-hidden-size must be set (positive) with --num-experts")

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None


@dataclass(frozen=True)
class ParallelConfig:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    moe_token_dispatcher_type: str = "allgather"

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"--{_flag(name)} must be a positive integer, got {value!r}")
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


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int, tensor_model_parallel_size: int) -> int:
    """The one place vocab padding is computed. Megatron's GPTModel does not pad: the embedding and
    output layer need a row count divisible by TP (and, for speed, by --make-vocab-size-divisible-by)."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class MegatronConfig:
    """Architecture + parallel layout, cross-validated; `padded_vocab_size` is derived once here."""

    arch: ModelArch
    parallel: ParallelConfig
    padded_vocab_size: int = field(init=False)

    def __post_init__(self) -> None:
        arch, par = self.arch, self.parallel
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
        object.__setattr__(self, "padded_vocab_size",
                           padded_vocab_size(arch.vocab_size, arch.make_vocab_size_divisible_by, tp))


_FLAG_OF_FIELD = {"add_bias_linear": "disable-bias-linear (inverted)"}


def _flag(field_name: str) -> str:
    return _FLAG_OF_FIELD.get(field_name, field_name.replace("_", "-"))


# ---------------------------------------------------------------------------------------------
# argparse
# ---------------------------------------------------------------------------------------------


def add_megatron_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the model and parallelism groups with Megatron's flag names and defaults (except dropout,
    which defaults to 0 for RL, and --moe-router-load-balancing-type, which defaults to none)."""
    model = parser.add_argument_group("megatron model")
    model.add_argument("--num-layers", type=int)
    model.add_argument("--hidden-size", type=int)
    model.add_argument("--ffn-hidden-size", type=int)
    model.add_argument("--num-attention-heads", type=int)
    model.add_argument("--group-query-attention", action="store_true")
    model.add_argument("--num-query-groups", type=int)
    model.add_argument("--kv-channels", type=int, help="head dim; default hidden-size / num-attention-heads")
    model.add_argument("--normalization", default="LayerNorm", choices=NORMALIZATIONS)
    model.add_argument("--norm-epsilon", type=float, default=1e-5)
    model.add_argument("--swiglu", action="store_true")
    model.add_argument("--disable-bias-linear", action="store_true")
    model.add_argument("--add-qkv-bias", action="store_true")
    model.add_argument("--qk-layernorm", action="store_true")
    model.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    model.add_argument("--position-embedding-type", default="rope", choices=POSITION_EMBEDDINGS)
    model.add_argument("--rotary-base", type=float, default=10000.0)
    model.add_argument("--vocab-size", type=int, help="the real (tokenizer) vocab size; padding is derived")
    model.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    model.add_argument("--seq-length", type=int)
    model.add_argument("--max-position-embeddings", type=int)
    model.add_argument("--attention-dropout", type=float, default=0.0)
    model.add_argument("--hidden-dropout", type=float, default=0.0)
    model.add_argument("--num-experts", type=int)
    model.add_argument("--moe-router-topk", type=int, default=2)
    model.add_argument("--moe-ffn-hidden-size", type=int)
    model.add_argument("--moe-router-pre-softmax", action="store_true")
    model.add_argument("--moe-router-load-balancing-type", default="none", choices=LOAD_BALANCING)
    model.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    parallel = parser.add_argument_group("megatron parallelism")
    parallel.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parallel.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    parallel.add_argument("--expert-model-parallel-size", type=int, default=1)
    parallel.add_argument("--sequence-parallel", action="store_true")
    parallel.add_argument("--moe-token-dispatcher-type", default="allgather", choices=DISPATCHERS)
    return parser


def model_arch_from_args(args: argparse.Namespace) -> ModelArch:
    for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"):
        _require(getattr(args, name) is not None, f"--{_flag(name)} is required")
    _require(args.seq_length is not None or args.max_position_embeddings is not None,
             "--seq-length or --max-position-embeddings is required")
    if args.num_query_groups is not None:
        _require(args.group_query_attention, "--num-query-groups needs --group-query-attention")
    if args.group_query_attention:
        _require(args.num_query_groups is not None, "--group-query-attention needs --num-query-groups")
    if args.kv_channels is None:
        _require(args.hidden_size % args.num_attention_heads == 0,
                 f"--num-attention-heads {args.num_attention_heads} must divide --hidden-size {args.hidden_size} "
                 "unless --kv-channels is given")
    seq_length = args.seq_length if args.seq_length is not None else args.max_position_embeddings
    return ModelArch(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else args.num_attention_heads,
        kv_channels=args.kv_channels if args.kv_channels is not None else args.hidden_size // args.num_attention_heads,
        vocab_size=args.vocab_size,
        max_position_embeddings=seq_length if args.max_position_embeddings is None else args.max_position_embeddings,
        seq_length=seq_length,
        normalization=args.normalization,
        norm_epsilon=args.norm_epsilon,
        swiglu=args.swiglu,
        add_bias_linear=not args.disable_bias_linear,
        add_qkv_bias=args.add_qkv_bias,
        qk_layernorm=args.qk_layernorm,
        untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_base=args.rotary_base,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
        num_experts=args.num_experts,
        moe_router_topk=args.moe_router_topk,
        moe_ffn_hidden_size=args.moe_ffn_hidden_size,
        moe_router_pre_softmax=args.moe_router_pre_softmax,
        moe_router_load_balancing_type=args.moe_router_load_balancing_type,
        moe_aux_loss_coeff=args.moe_aux_loss_coeff,
        attention_dropout=args.attention_dropout,
        hidden_dropout=args.hidden_dropout,
    )


def parallel_config_from_args(args: argparse.Namespace) -> ParallelConfig:
    return ParallelConfig(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        expert_model_parallel_size=args.expert_model_parallel_size,
        sequence_parallel=args.sequence_parallel,
        moe_token_dispatcher_type=args.moe_token_dispatcher_type,
    )


def megatron_config_from_args(args: argparse.Namespace) -> MegatronConfig:
    return MegatronConfig(arch=model_arch_from_args(args), parallel=parallel_config_from_args(args))


def arch_differences(expected: ModelArch, actual: ModelArch) -> list[str]:
    """Flags whose values differ, as '--flag: a != b' (for 'flags disagree with the checkpoint')."""
    out = []
    for name in expected.__dataclass_fields__:
        a, b = getattr(expected, name), getattr(actual, name)
        if a != b:
            out.append(f"--{_flag(name)}: {a!r} != {b!r}")
    return out
