import json
import shutil

import pytest

from lean_rl.backends.sglang.model_check import ModelDirError, check_model_dir, sglang_native_architectures


@pytest.fixture
def model_copy(tiny_qwen2, tmp_path):
    """A private copy of the tiny Qwen2 checkpoint that a test may break."""
    return shutil.copytree(tiny_qwen2, tmp_path / "model")


def test_a_good_checkpoint_passes(tiny_qwen2):
    info = check_model_dir(tiny_qwen2)
    assert info.architectures == ("Qwen2ForCausalLM",)
    assert info.model_type == "qwen2"
    assert info.vocab_size == json.loads((tiny_qwen2 / "config.json").read_text())["vocab_size"]


def test_the_parsed_architecture_list_has_the_models_we_serve():
    native = sglang_native_architectures()
    assert {"Qwen2ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"} <= native
    assert len(native) > 100
    assert "FooBarForCausalLM" not in native


def test_missing_directory(tmp_path):
    with pytest.raises(ModelDirError, match=rf"--hf-checkpoint: model directory {tmp_path}/absent does not exist"):
        check_model_dir(tmp_path / "absent")


def test_a_file_instead_of_a_directory(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelDirError, match="is not a directory"):
        check_model_dir(tmp_path / "weights.bin")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelDirError, match="has no config.json"):
        check_model_dir(tmp_path)


def test_unreadable_config(model_copy):
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelDirError, match="config.json is not readable JSON"):
        check_model_dir(model_copy)


def test_directory_without_tokenizer(model_copy):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_copy / name).unlink()
    with pytest.raises(ModelDirError, match=r"--hf-checkpoint: .*model has no tokenizer \(looked for tokenizer.json"):
        check_model_dir(model_copy)
    # ...which is fine when the tokenizer comes from elsewhere or is not needed
    assert check_model_dir(model_copy, skip_tokenizer_init=True).architectures == ("Qwen2ForCausalLM",)


def test_tokenizer_path_is_checked_instead(model_copy, tiny_qwen2, tmp_path):
    (model_copy / "tokenizer.json").unlink()
    check_model_dir(model_copy, tokenizer_path=tiny_qwen2)
    with pytest.raises(ModelDirError, match="--sglang-tokenizer-path: .* has no tokenizer"):
        check_model_dir(tiny_qwen2, tokenizer_path=tmp_path)


@pytest.mark.parametrize(
    "architectures, expected",
    [
        (["FooBarForCausalLM"], "config.json: architecture FooBarForCausalLM is not supported by SGLang"),
        ([], "'architectures' must be a non-empty list"),
        ("Qwen2ForCausalLM", "'architectures' must be a non-empty list"),
        (None, "'architectures' must be a non-empty list"),
    ],
)
def test_unsupported_or_malformed_architecture(model_copy, architectures, expected):
    config = json.loads((model_copy / "config.json").read_text())
    config["architectures"] = architectures
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirError, match=expected):
        check_model_dir(model_copy)


def test_an_architecture_only_transformers_has_is_accepted(model_copy):
    # SGLang serves classes it lacks through its transformers backend.
    config = json.loads((model_copy / "config.json").read_text())
    config["architectures"] = ["GPTNeoForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps(config))
    assert "GPTNeoForCausalLM" not in sglang_native_architectures()
    assert check_model_dir(model_copy).architectures == ("GPTNeoForCausalLM",)
