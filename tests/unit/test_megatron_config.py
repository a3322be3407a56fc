import argparse
import dataclasses
import shlex

import pytest

from lean_rl.backends.megatron.config import (MegatronConfig, ModelFlags, ParallelConfig, arch_differences,
                                              padded_vocab_size)
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import arch_from_hf_config
from lean_rl.options import ConfigError, add_options, read_options


def dense(**overrides) -> ModelArch:
    base = dict(num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
                kv_channels=16, vocab_size=512, max_position_embeddings=4096, seq_length=4096,
                normalization="RMSNorm", swiglu=True, add_bias_linear=False)
    return ModelArch(**{**base, **overrides})


def moe(**overrides) -> ModelArch:
    return dense(**{**dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128), **overrides})


@pytest.mark.parametrize("vocab, divisible_by, tp, expected", [
    (512, 128, 1, 512), (512, 128, 2, 512), (500, 128, 2, 512), (513, 128, 1, 640),
    (512, 96, 1, 576), (512, 96, 2, 576), (151936, 128, 8, 152576), (7, 1, 2, 8),
])
def test_padded_vocab_size(vocab, divisible_by, tp, expected):
    assert padded_vocab_size(vocab, divisible_by, tp) == expected


def test_config_derives_padded_vocab_once_and_is_frozen():
    config = MegatronConfig(dense(make_vocab_size_divisible_by=96), ParallelConfig(tensor_model_parallel_size=2))
    assert config.padded_vocab_size == 576
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.padded_vocab_size = 512
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.arch.num_layers = 4


@pytest.mark.parametrize("arch, parallel, message", [
    (dense(), ParallelConfig(tensor_model_parallel_size=3),
     "--tensor-model-parallel-size 3 must divide --num-attention-heads 4"),
    (dense(num_attention_heads=8, kv_channels=8), ParallelConfig(tensor_model_parallel_size=4),
     "--tensor-model-parallel-size 4 must divide --num-query-groups 2"),
    (dense(ffn_hidden_size=255), ParallelConfig(tensor_model_parallel_size=2),
     "--tensor-model-parallel-size 2 must divide --ffn-hidden-size 255"),
    (dense(), ParallelConfig(pipeline_model_parallel_size=3),
     "--pipeline-model-parallel-size 3 must divide --num-layers 2"),
    (moe(), ParallelConfig(expert_model_parallel_size=3), "--expert-model-parallel-size 3 must divide --num-experts 4"),
    (dense(), ParallelConfig(expert_model_parallel_size=2), "--expert-model-parallel-size > 1 needs --num-experts"),
    (moe(), ParallelConfig(tensor_model_parallel_size=2),
     "--sequence-parallel is required for MoE with --tensor-model-parallel-size > 1"),
    (moe(moe_ffn_hidden_size=129), ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True),
     "must divide --moe-ffn-hidden-size 129"),
])
def test_layout_validation_names_the_flags(arch, parallel, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MegatronConfig(arch, parallel)


@pytest.mark.parametrize("overrides, message", [
    (dict(num_query_groups=3), "--num-query-groups 3 must divide --num-attention-heads 4"),
    (dict(seq_length=8192), "--seq-length 8192 exceeds --max-position-embeddings 4096"),
    (dict(num_layers=0), "--num-layers must be a positive integer"),
    (dict(normalization="ScaleNorm"), "--normalization 'ScaleNorm'"),
    (dict(position_embedding_type="learned_absolute"), "--position-embedding-type 'learned_absolute'"),
    (dict(moe_ffn_hidden_size=128), "--moe-ffn-hidden-size needs --num-experts"),
    (dict(num_experts=4, moe_router_topk=5, moe_ffn_hidden_size=128), r"--moe-router-topk 5 must be in \[1"),
    (dict(num_experts=4), "--moe-ffn-hidden-size must be set"),
])
def test_arch_validation_names_the_flags(overrides, message):
    with pytest.raises(ConfigError, match=message):
        dense(**overrides)


def test_parallel_validation_and_world_size():
    with pytest.raises(ConfigError, match="--sequence-parallel needs --tensor-model-parallel-size > 1"):
        ParallelConfig(sequence_parallel=True)
    with pytest.raises(ConfigError, match="--moe-token-dispatcher-type 'flex'"):
        ParallelConfig(moe_token_dispatcher_type="flex")
    ep2 = ParallelConfig(expert_model_parallel_size=2)
    assert ep2.min_world_size == 2 and ep2.data_parallel_size(2) == 2 and ep2.data_parallel_size(4) == 4
    with pytest.raises(ConfigError, match="--expert-model-parallel-size 2 must divide the data-parallel size 1"):
        ep2.data_parallel_size(1)
    tp2pp2 = ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert tp2pp2.min_world_size == 4 and tp2pp2.data_parallel_size(8) == 2
    with pytest.raises(ConfigError, match="world size 6 must be a multiple of"):
        tp2pp2.data_parallel_size(6)


QWEN2_TINY_FLAGS = (
    "--num-layers 2 --hidden-size 64 --ffn-hidden-size 256 --num-attention-heads 4 --group-query-attention "
    "--num-query-groups 2 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear "
    "--add-qkv-bias --untie-embeddings-and-output-weights --position-embedding-type rope --rotary-base 10000 "
    "--vocab-size 512 --seq-length 4096 --max-position-embeddings 4096 --tensor-model-parallel-size 2 "
    "--sequence-parallel"
)


def megatron_config_of(flags: str) -> MegatronConfig:
    parser = add_options(add_options(argparse.ArgumentParser(), ModelFlags), ParallelConfig)
    args = parser.parse_args(shlex.split(flags))
    return MegatronConfig(read_options(ModelFlags, args).arch(), read_options(ParallelConfig, args))


def test_megatron_flags_build_the_same_arch_as_the_hf_config(tiny_qwen2):
    config = megatron_config_of(QWEN2_TINY_FLAGS)
    assert config.arch == arch_from_hf_config(tiny_qwen2)
    assert config.parallel == ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True)
    assert config.arch.kv_channels == 16  # hidden / heads when --kv-channels is absent


@pytest.mark.parametrize("flags, message", [
    (QWEN2_TINY_FLAGS.replace("--num-layers 2 ", ""), "--num-layers is required"),
    (QWEN2_TINY_FLAGS.replace("--group-query-attention ", ""), "--num-query-groups needs --group-query-attention"),
    (QWEN2_TINY_FLAGS.replace("--num-query-groups 2 ", ""), "--group-query-attention needs --num-query-groups"),
    (QWEN2_TINY_FLAGS.replace("--seq-length 4096 --max-position-embeddings 4096 ", ""),
     "--seq-length or --max-position-embeddings is required"),
])
def test_flag_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        megatron_config_of(flags)


def test_arch_differences_name_the_flags():
    diffs = arch_differences(dense(), dense(hidden_size=128, kv_channels=32, add_bias_linear=True))
    assert diffs == ["--hidden-size: 64 != 128", "--kv-channels: 16 != 32",
                     "--disable-bias-linear (inverted): False != True"]


def test_model_flags_round_trip_an_arch_and_take_their_defaults_from_it():
    for arch in (dense(), moe(), dense(num_query_groups=4)):
        assert ModelFlags.of(arch).arch() == arch
    assert ModelFlags.of(dense(num_query_groups=4)).group_query_attention is False
    for f in dataclasses.fields(ModelArch):
        if f.default is not dataclasses.MISSING:
            assert getattr(ModelFlags(), f.name) == f.default, f.name
