"""The converters' command lines end to end, and their HF output in real consumers: transformers
loads it (weights, config, tokenizer) without edits and computes the original logits; SGLang serves
it through /update_weights_from_disk (on the shared engine group, restored afterwards)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_convert_megatron import assert_same_hf_checkpoint, hf_tensors

from lean_rl.backends.megatron.arch_flags import model_args_script
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.convert.dcp_io import DistCheckpointReader
from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)


def logits(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe", *(pytest.param(f, marks=pytest.mark.slow) for f in ("llama", "qwen3"))])
def test_command_lines_round_trip_and_transformers_loads_the_result(family, tiny_model_factory, tmp_path):
    original = tiny_model_factory(family)
    made = run_cli("tools/convert_ckpt/hf_to_megatron.py", "--hf", str(original), "--save", str(tmp_path / "mg"),
                   "--tensor-model-parallel-size", "2")
    assert made.returncode == 0, made.stderr
    back = run_cli("-m", "lean_rl.convert", "megatron-to-hf", "--load", str(tmp_path / "mg"),
                   "--save", str(tmp_path / "hf"), "--max-shard-size", "150KB")
    assert back.returncode == 0, back.stderr
    assert_same_hf_checkpoint(original, tmp_path / "hf")

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    reference = transformers.AutoTokenizer.from_pretrained(original)
    chat = [{"role": "user", "content": "3 + 4 = ?"}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == reference.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    tokens = tokenizer(text)["input_ids"]
    assert tokens == reference(text)["input_ids"] and tokenizer.eos_token == reference.eos_token
    assert torch.equal(logits(tmp_path / "hf", tokens), logits(original, tokens))


def test_print_megatron_args_and_flag_errors_on_the_command_line(tiny_model_factory, tmp_path):
    original = tiny_model_factory("qwen3")
    printed = run_cli("-m", "lean_rl.convert", "hf-to-megatron", "--hf", str(original), "--print-megatron-args")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == model_args_script(original, title=original.name)
    wrong = run_cli("tools/convert_ckpt/hf_to_megatron.py", "--hf", str(original), "--save", str(tmp_path / "mg"),
                    "--num-layers", "3")
    assert wrong.returncode == 2
    assert "--num-layers gives num_layers=3 but the HF config (num_hidden_layers) gives 2" in wrong.stderr
    unknown = run_cli("tools/convert_ckpt/hf_to_megatron.py", "--hf", str(original), "--save", str(tmp_path / "mg"),
                      "--tensor-parallel", "2")
    assert unknown.returncode == 2 and "unrecognized arguments: --tensor-parallel" in unknown.stderr
    assert not (tmp_path / "mg").exists()


def test_dtype_choices(tiny_model_factory, tmp_path):
    original = tiny_model_factory("llama")
    reference = load_file(str(original / "model.safetensors"))
    convert_hf_to_megatron(original, tmp_path / "mg", dtype=torch.bfloat16)
    stored = DistCheckpointReader(tmp_path / "mg" / "iter_0000000").tensors()
    assert {t.properties.dtype for t in stored.values()} == {torch.bfloat16}
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "f32")  # the HF config declares float32
    assert all(torch.equal(t, reference[n].bfloat16().float()) for n, t in hf_tensors(tmp_path / "f32").items())
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "bf16", dtype=torch.bfloat16)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto")
    assert model.dtype == torch.bfloat16
    assert torch.equal(model.model.embed_tokens.weight, reference["model.embed_tokens.weight"].bfloat16())


def test_tied_embeddings_round_trip(tiny_model_factory, tmp_path):
    tied = Path(shutil.copytree(tiny_model_factory("qwen2"), tmp_path / "tied"))
    tensors = load_file(str(tied / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(tied / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    convert_hf_to_megatron(tied, tmp_path / "mg")
    assert "output_layer.weight" not in DistCheckpointReader(tmp_path / "mg" / "iter_0000000").tensors()
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "hf")
    assert_same_hf_checkpoint(tied, tmp_path / "hf")
    tokens = [5, 17, 42, 99, 3]
    assert torch.equal(logits(tmp_path / "hf", tokens), logits(tied, tokens))


def test_sglang_serves_a_converted_checkpoint(engine_group, tiny_qwen2, tiny_model_factory, tmp_path):
    """Another model (seed 1) through HF -> Megatron -> HF, sharded, loaded into one engine from disk:
    it generates what transformers computes for that model; then the engine gets the original back."""
    from test_sglang_engines import transformers_output_log_probs

    other = tiny_model_factory("qwen2", seed=1)
    convert_hf_to_megatron(other, tmp_path / "mg")
    convert_megatron_to_hf(tmp_path / "mg", tmp_path / "hf", max_shard_bytes=150_000)
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1
    prompt = transformers.AutoTokenizer.from_pretrained(tiny_qwen2)("the cat sat on the mat")["input_ids"]
    engine = BlockingEngineClient(engine_group.engine_urls[0], api_key=engine_group.config.api_key)
    try:
        before = engine.generate(prompt, GREEDY, return_logprob=True)
        assert engine.update_weights_from_disk(str(tmp_path / "hf"), weight_version="converted")["success"]
        served = engine.generate(prompt, GREEDY, return_logprob=True)
        assert served.weight_version == "converted" and served.output_ids != before.output_ids
        reference = transformers_output_log_probs(other, prompt, served.output_ids)
        assert (torch.tensor(served.output_log_probs) - reference).abs().max().item() <= 1e-4
    finally:
        engine.update_weights_from_disk(str(tiny_qwen2), weight_version="restored")
        restored = engine.generate(prompt, GREEDY, return_logprob=True)
        engine.close()
    assert restored.output_ids == before.output_ids
