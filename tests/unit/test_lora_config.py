"""LoRA flags (errors name the flag) and the adapter's arithmetic, written out: the layer's output gains
alpha / rank * B A x, and the merged weight the engines get computes the same thing."""

import argparse
import math

import pytest
import torch

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.train_config import TrainConfig
from lean_rl.backends.megatron.lora_config import LORA_TARGETS, LoraConfig
from lean_rl.options import ConfigError, add_options, build, read_options


def _parse(*argv) -> LoraConfig:
    args = add_options(argparse.ArgumentParser(), TrainConfig, "optimizer").parse_args(list(argv))
    return read_options(TrainConfig, args).lora


def test_flags():
    assert not _parse().enabled
    cfg = _parse("--lora-rank", "8", "--lora-alpha", "4", "--lora-dropout", "0.1",
                 "--lora-target-modules", "linear_qkv,linear_proj", "linear_fc2")
    assert cfg.enabled and cfg.lora_rank == 8 and cfg.lora_dropout == 0.1
    assert cfg.lora_target_modules == ("linear_qkv", "linear_proj", "linear_fc2")
    assert cfg.scaling == 4 / 8
    default = _parse("--lora-rank", "16")
    assert default.scaling == 2.0 and default.lora_target_modules == ()  # alpha = 2 x rank; every target
    assert LORA_TARGETS == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@pytest.mark.parametrize("build, flag", [
    (lambda: build(LoraConfig, lora_rank=-1), "--lora-rank"),
    (lambda: build(LoraConfig, lora_rank=8, lora_target_modules=("q_proj",)), "--lora-target-modules q_proj"),
    (lambda: build(LoraConfig, lora_rank=8, lora_alpha=0.0), "--lora-alpha"),
    (lambda: build(LoraConfig, lora_rank=8, lora_dropout=1.0), "--lora-dropout"),
    (lambda: build(LoraConfig, lora_alpha=16.0), "--lora-alpha has no effect without --lora-rank"),
    (lambda: build(LoraConfig, lora_target_modules=("linear_qkv",)), "--lora-target-modules has no effect"),
    (lambda: build(LoraConfig, lora_rank=8).check_parallel(
        ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True)), "cannot take --sequence-parallel"),
    (lambda: build(LoraConfig, lora_rank=8, lora_dropout=0.1).check_parallel(
        ParallelConfig(tensor_model_parallel_size=2)), "--lora-dropout > 0 with --tensor-model-parallel-size > 1"),
])
def test_errors_name_the_flag(build, flag):
    with pytest.raises(ConfigError, match=flag):
        build()


def test_adapter_adds_scaled_low_rank_update_and_merges_to_the_same_map():
    from lean_rl.backends.megatron.lora import LoraAdapter

    rank, fan_in, fan_out, scaling = 3, 10, 7, 2.5
    w = torch.randn(fan_out, fan_in, dtype=torch.float32)
    adapter = LoraAdapter(fan_in, fan_out, rank, scaling, 0.0, torch.Generator().manual_seed(0), like=w)
    assert adapter.a.shape == (rank, fan_in) and adapter.b.shape == (fan_out, rank)
    assert adapter.a.abs().max() <= 1 / math.sqrt(fan_in) and torch.equal(adapter.b, torch.zeros(fan_out, rank))
    x = torch.randn(5, fan_in, dtype=torch.float32)
    assert torch.equal(adapter.delta(x), torch.zeros(5, fan_out))  # B = 0: the base layer exactly
    with torch.no_grad():
        adapter.b.copy_(torch.randn(fan_out, rank, dtype=torch.float32))
    a, b = adapter.a.detach(), adapter.b.detach()
    by_hand = scaling * torch.einsum("or,ri,ni->no", b, a, x)
    torch.testing.assert_close(adapter.delta(x), by_hand)
    torch.testing.assert_close(x @ adapter.merged(w).T, x @ w.T + by_hand)
    assert adapter.merged(w).dtype == w.dtype


def test_a_vlm_serves_its_language_models_adapter(tmp_path):
    """A Qwen2.5-VL's adapters are its language model's (qwen2's HF modules): --lora-sync adapter can serve them."""
    import json

    from lean_rl.config_checks import lora_unserved_family

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "text_config": {}}))
    assert lora_unserved_family(str(tmp_path), LoraConfig(lora_rank=4)) is None
