"""python -m lean_rl.evaluate before any engine starts (lean_rl/evaluate_checkpoint.py): each bad input is
one line naming the flag, and a Megatron checkpoint (--load) converts back to the HF weights it came from.
The engines' part runs in tests/e2e/test_evaluate_checkpoint.py (slow)."""

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file

from lean_rl.config import build_parser
from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
from lean_rl.evaluate_checkpoint import checkpoint_source, convert_loaded, evaluate_command, run_argv
from lean_rl.options import ConfigError


@pytest.fixture
def eval_config(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "a", "label": "b"}) + "\n")
    path = tmp_path / "eval.yaml"
    path.write_text(f"eval:\n  datasets:\n    - {{name: toy, path: {tmp_path / 'p.jsonl'}, n_samples_per_eval_prompt: 4}}\n")
    return path


@pytest.mark.parametrize("argv, message", [
    ([], r"^--eval-output PATH is required"),
    (["--eval-output", "{tmp}/s.json", "--eval-config", "{cfg}"], r"^give the checkpoint to evaluate: --hf-checkpoint"),
    (["--eval-output", "{tmp}/s.json", "--hf-checkpoint", "{tmp}/none", "--eval-config", "{cfg}"],
     r"^--hf-checkpoint .*/none: no such directory"),
    (["--eval-output", "{tmp}/s.json", "--load", "{tmp}/none", "--eval-config", "{cfg}"],
     r"^--load .*/none: .*no such directory"),
    (["--eval-output", "{tmp}/s.json", "--hf-checkpoint", "{model}"], r"^nothing to evaluate: give --eval-config"),
    (["--eval-output", "{tmp}/s.json", "--hf-checkpoint", "{model}", "--eval-config", "{tmp}/none.yaml"],
     r"^--eval-config .*/none.yaml: cannot read the file"),
    (["--eval-output", "{tmp}/s.json", "--hf-checkpoint", "{model}", "--eval-config", "{cfg}", "--eval-pass-k", "8"],
     r"^--eval-pass-k \(set toy\): pass@k needs an integer k with 1 <= k <= n_samples_per_eval_prompt \(4\), got 8"),
    (["--eval-output", "{tmp}", "--hf-checkpoint", "{model}", "--eval-config", "{cfg}"], r"^--eval-output .*is a directory"),
])
def test_bad_input_is_one_line_naming_the_flag(argv, message, tmp_path, eval_config, tiny_qwen2):
    argv = [a.format(tmp=tmp_path, cfg=eval_config, model=tiny_qwen2) for a in argv]
    with pytest.raises(ConfigError, match=message) as err:
        evaluate_command(argv)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "s.json").exists()


def _args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_known_args(argv)[0]


def test_a_megatron_checkpoint_converts_back_to_its_hf_weights(tiny_qwen2, tmp_path, eval_config):
    convert_hf_to_megatron(tiny_qwen2, tmp_path / "ckpt", iteration=5)
    args = _args(["--load", str(tmp_path / "ckpt"), "--eval-config", str(eval_config)])
    source = checkpoint_source(args, tmp_path / "out" / "scores.json")
    assert source.converted and source.load == str(tmp_path / "ckpt")
    assert source.hf_dir.parent == tmp_path / "out"  # beside the JSON, removed after the evaluation
    convert_loaded(source, None)  # config and tokenizer from the checkpoint's own hf_config/
    original = {k: v for f in tiny_qwen2.glob("*.safetensors") for k, v in load_file(f).items()}
    converted = {k: v for f in source.hf_dir.glob("*.safetensors") for k, v in load_file(f).items()}
    assert converted.keys() == original.keys()
    assert all(torch.equal(converted[k].to(original[k].dtype), original[k]) for k in original)
    # the run it becomes: no trainer, the converted directory served, the set's file as --prompt-data
    argv = run_argv(["--load", str(tmp_path / "ckpt"), "--eval-config", str(eval_config)], args, source.hf_dir)
    assert "--load" not in argv and argv[argv.index("--hf-checkpoint") + 1] == str(source.hf_dir)
    assert "--debug-rollout-only" in argv and argv[argv.index("--prompt-data") + 1] == str(tmp_path / "p.jsonl")
