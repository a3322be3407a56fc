"""Bad input to the converters: each gives an error naming the problem (file, tensor, flag, values)
and leaves no output directory (and no temporary one) behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.convert import hf_to_megatron as h2m
from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf
from lean_rl.convert.output_dir import OutputExistsError
from lean_rl.convert.safetensors_io import CheckpointError
from lean_rl.options import ConfigError


def assert_nothing_written(out: Path) -> None:
    assert not out.exists(), f"{out} was left behind"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.partial")], "temporary left"


@pytest.fixture
def hf_copy(tiny_model_factory, tmp_path):
    """A writable copy of the tiny qwen2 checkpoint."""
    return Path(shutil.copytree(tiny_model_factory("qwen2"), tmp_path / "hf"))


@pytest.fixture
def sharded_hf(tiny_model_factory, tmp_path_factory):
    """The tiny qwen2 as a sharded HF checkpoint with an index (made by the converters themselves)."""
    base = tmp_path_factory.mktemp("sharded")
    convert_hf_to_megatron(tiny_model_factory("qwen2"), base / "mg")
    convert_megatron_to_hf(base / "mg", base / "hf", max_shard_bytes=100_000)
    return base / "hf"


@pytest.fixture(scope="module")
def megatron_qwen2(tiny_model_factory, tmp_path_factory):
    base = tmp_path_factory.mktemp("mg")
    convert_hf_to_megatron(tiny_model_factory("qwen2"), base / "mg")
    return base / "mg"


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


def test_unsupported_architecture_names_the_supported_ones(hf_copy, tmp_path):
    edit_config(hf_copy, model_type="gpt2")
    with pytest.raises(ConfigError, match=r"'gpt2' is not supported; supported: llama, qwen2, qwen3, qwen3_moe"):
        convert_hf_to_megatron(hf_copy, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def shard_names(directory: Path) -> list[str]:
    return sorted(set(json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"].values()))


def test_missing_shard_is_named(sharded_hf, tmp_path):
    broken = Path(shutil.copytree(sharded_hf, tmp_path / "broken"))
    missing = shard_names(broken)[1]
    (broken / missing).unlink()
    with pytest.raises(CheckpointError, match=rf"names shard\(s\) that do not exist: {missing}"):
        convert_hf_to_megatron(broken, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_truncated_shard_is_named_with_sizes(sharded_hf, tmp_path):
    broken = Path(shutil.copytree(sharded_hf, tmp_path / "broken"))
    shard = broken / shard_names(broken)[2]
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(CheckpointError, match=rf"{shard.name}: truncated: tensor .* ends at byte "
                                              rf"{size}, the file has {size - 100} bytes"):
        convert_hf_to_megatron(broken, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_dtype_mismatch_names_the_tensor(hf_copy, tmp_path):
    tensors = load_file(str(hf_copy / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"].bfloat16()
    save_file(tensors, str(hf_copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"dtype mismatch: model.layers.1.mlp.up_proj.weight is torch.bfloat16 "
                                              r".* but config.json declares torch.float32"):
        convert_hf_to_megatron(hf_copy, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_dtype_mismatch_with_the_config_is_an_error(hf_copy, tmp_path):
    edit_config(hf_copy, dtype="bfloat16")
    with pytest.raises(CheckpointError, match=r"dtype mismatch: .* is torch.float32 .* config.json declares torch.bfloat16"):
        convert_hf_to_megatron(hf_copy, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_vocab_size_mismatch_names_both_sizes(hf_copy, tmp_path):
    edit_config(hf_copy, vocab_size=600)
    with pytest.raises(CheckpointError, match=r"vocab size mismatch: config.json has vocab_size=600 but "
                                              r"model.embed_tokens.weight has 512 rows"):
        convert_hf_to_megatron(hf_copy, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_tp_that_does_not_divide_heads(tiny_model_factory, tmp_path):
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size 3 must divide --num-attention-heads 4"):
        convert_hf_to_megatron(tiny_model_factory("qwen2"), tmp_path / "out",
                               parallel=ParallelConfig(tensor_model_parallel_size=3))
    with pytest.raises(ConfigError, match=r"--expert-model-parallel-size 3 must divide --num-experts 4"):
        convert_hf_to_megatron(tiny_model_factory("qwen3_moe"), tmp_path / "out",
                               parallel=ParallelConfig(expert_model_parallel_size=3))
    assert_nothing_written(tmp_path / "out")


def test_flags_that_contradict_the_hf_config_name_both_values(tiny_model_factory, tmp_path):
    with pytest.raises(ConfigError, match=r"--hidden-size gives hidden_size=128 but the HF config \(hidden_size\) gives 64"):
        convert_hf_to_megatron(tiny_model_factory("qwen2"), tmp_path / "out", given_flags={"hidden_size": 128})
    assert_nothing_written(tmp_path / "out")


def test_tensor_of_another_architecture_is_rejected(hf_copy, tmp_path):
    tensors = load_file(str(hf_copy / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(tensors, str(hf_copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"the qwen2 table does not map .*q_norm"):
        convert_hf_to_megatron(hf_copy, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_a_multi_token_prediction_layer_is_left_out_only_where_the_config_declares_it(hf_copy, tmp_path):
    """GLM-4.5 and DeepSeek-V3 store num_nextn_predict_layers MTP layers after the last decoder layer."""
    tensors = load_file(str(hf_copy / "model.safetensors"))
    tensors["model.layers.2.eh_proj.weight"] = torch.ones(64, 128)  # the tiny model has layers 0 and 1
    save_file(tensors, str(hf_copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"the qwen2 table does not map .*model.layers.2.eh_proj"):
        convert_hf_to_megatron(hf_copy, tmp_path / "out")
    edit_config(hf_copy, num_nextn_predict_layers=1)
    convert_hf_to_megatron(hf_copy, tmp_path / "out")


def test_existing_output_is_not_overwritten(tiny_model_factory, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="already exists and is not empty"):
        convert_hf_to_megatron(tiny_model_factory("qwen2"), tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_failure_while_writing_leaves_nothing(tiny_model_factory, tmp_path, monkeypatch):
    calls = []
    real = h2m.read_tp1  # every chunk of a same-dtype conversion is read through it

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(h2m, "read_tp1", failing)
    with pytest.raises(OSError, match="disk full"):
        convert_hf_to_megatron(tiny_model_factory("qwen2"), tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


# -- megatron_to_hf ---------------------------------------------------------------------------------


def test_missing_and_truncated_distcp_are_named(megatron_qwen2, tmp_path):
    broken = Path(shutil.copytree(megatron_qwen2, tmp_path / "broken"))
    data = sorted((broken / "iter_0000000").glob("*.distcp"))[0]
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError, match=rf"{data.name}: truncated: the checkpoint metadata needs {size} bytes"):
        convert_megatron_to_hf(broken, tmp_path / "out")
    data.unlink()
    with pytest.raises(CheckpointError, match=rf"{data.name}: missing"):
        convert_megatron_to_hf(broken, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def test_hf_config_of_another_architecture_is_rejected(megatron_qwen2, tiny_model_factory, tmp_path):
    with pytest.raises(CheckpointError, match=r"q_layernorm.weight is missing \(the qwen3 table needs it"):
        convert_megatron_to_hf(megatron_qwen2, tmp_path / "out", hf_config=tiny_model_factory("qwen3"))
    other = Path(shutil.copytree(tiny_model_factory("qwen2"), tmp_path / "cfg"))
    edit_config(other, num_hidden_layers=3)
    with pytest.raises(CheckpointError, match=r"is \[2, .*the HF config implies \[3, "):
        convert_megatron_to_hf(megatron_qwen2, tmp_path / "out", hf_config=other)
    edit_config(other, num_hidden_layers=2, vocab_size=700)
    with pytest.raises(CheckpointError, match=r"vocab size mismatch: embedding.word_embeddings.weight has 512 rows, "
                                              r"the HF config says vocab_size=700"):
        convert_megatron_to_hf(megatron_qwen2, tmp_path / "out", hf_config=other)
    assert_nothing_written(tmp_path / "out")


def test_checkpoint_without_hf_config_needs_the_flag(megatron_qwen2, tmp_path):
    bare = Path(shutil.copytree(megatron_qwen2, tmp_path / "bare"))
    shutil.rmtree(bare / "iter_0000000" / "hf_config")
    with pytest.raises(CheckpointError, match=r"carries no hf_config/config.json; pass --hf-config DIR"):
        convert_megatron_to_hf(bare, tmp_path / "out")
    with pytest.raises(CheckpointError, match=r"neither a torch_dist checkpoint"):
        convert_megatron_to_hf(tmp_path, tmp_path / "out")
    with pytest.raises(CheckpointError, match=r"has no iteration 7"):
        convert_megatron_to_hf(bare, tmp_path / "out", iteration=7)
    assert_nothing_written(tmp_path / "out")
