"""--save-hf DIR on the tiny main job: after each checkpoint (--save-interval 1, 2 steps) its HF model
appears in DIR/step_N, written in the background and awaited at exit; transformers loads it, and its
logits equal those of the same checkpoint converted offline by `python -m lean_rl.convert
megatron-to-hf`; the trained weights differ from the starting model's."""

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.e2e.conftest import REPO, run_flags, run_lean_rl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _logits(model_dir, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def test_save_hf_writes_each_checkpoint_as_a_loadable_hf_model(tiny_qwen2, toy_data, tmp_path):
    ckpt, hf = tmp_path / "ckpt", tmp_path / "hf"
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", "2", "--save", str(ckpt),
                      "--save-interval", "1", "--save-hf", str(hf))
    result = run_lean_rl("lean_rl.train", flags, timeout_s=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert sorted(p.name for p in hf.iterdir()) == ["step_1", "step_2"]  # nothing partial, no failure log
    assert f"--save-hf: wrote {hf / 'step_2'}" in result.stderr + result.stdout

    offline = tmp_path / "offline"
    converted = subprocess.run([sys.executable, "-m", "lean_rl.convert", "megatron-to-hf", "--load", str(ckpt),
                                "--iteration", "2", "--hf-config", str(tiny_qwen2), "--save", str(offline)],
                               cwd=REPO, capture_output=True, text=True, timeout=600)
    assert converted.returncode == 0, converted.stderr[-3000:]

    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 11]])
    written = _logits(hf / "step_2", ids)
    assert torch.equal(written, _logits(offline, ids))
    assert not torch.allclose(written, _logits(tiny_qwen2, ids))  # trained: not the starting weights
    assert not torch.equal(written, _logits(hf / "step_1", ids))
