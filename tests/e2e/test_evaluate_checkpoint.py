"""`python -m lean_rl.evaluate` as a user runs it: the tiny model's HF checkpoint served on a real SGLang
engine and router (no trainer), scored on two --eval-config sets; the printed lines and the JSON file."""

import json

import pytest

from lean_rl.rollout.pass_at_k import mean_pass_at_k
from tests.e2e.conftest import run_lean_rl


@pytest.mark.slow
def test_an_hf_checkpoint_is_scored_with_pass_at_k_per_set(tiny_qwen2, toy_data, tmp_path):
    config = tmp_path / "eval.yaml"
    # one response token: the toy reward (the fraction of response tokens of the asked kind) is 0 or 1
    config.write_text(f"""eval:
  defaults: {{max_response_len: 1, temperature: 1.0}}
  datasets:
    - {{name: toy, path: {toy_data / 'eval.jsonl'}, n_samples_per_eval_prompt: 4, pass_k: [1, 2, 4]}}
    - {{name: toy_once, path: {toy_data / 'eval.jsonl'}, n_samples_per_eval_prompt: 1}}
""")
    out = tmp_path / "scores" / "scores.json"
    done = run_lean_rl("lean_rl.evaluate", [
        "--hf-checkpoint", str(tiny_qwen2), "--eval-config", str(config), "--eval-output", str(out),
        "--output-dir", str(tmp_path / "run"), "--no-tensorboard",
        "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
        "--rollout-num-engines", "1", "--sglang-max-total-tokens", "8192"], timeout_s=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("toy:", "toy_once:"))]
    assert len(lines) == 2 and "pass@4" in lines[0] and "reward_mean" in lines[1], done.stdout

    report = json.loads(out.read_text())
    assert report["checkpoint"] == {"hf_checkpoint": str(tiny_qwen2), "load": None}
    toy, once = report["sets"]["toy"], report["sets"]["toy_once"]
    assert (toy["samples"], once["samples"]) == (16 * 4, 16)
    assert list(toy["pass_at_k"]) == ["1", "2", "4"] and list(once["pass_at_k"]) == ["1"]
    for result in (toy, once):
        n, correct = result["n_samples_per_prompt"], result["correct_per_prompt"]
        assert len(correct) == 16 and all(0 <= c <= n for c in correct)
        for k, value in result["pass_at_k"].items():
            assert value == pytest.approx(mean_pass_at_k(correct, n, int(k)))
        assert result["metrics"]["failed"] == 0.0
    assert toy["pass_at_k"]["1"] <= toy["pass_at_k"]["2"] <= toy["pass_at_k"]["4"]
    assert 0.0 < toy["pass_at_k"]["4"]  # a random model answers some prompts with the asked kind of token
    assert toy["pass_at_k"]["1"] == pytest.approx(toy["metrics"]["reward_mean"])  # 0/1 rewards: pass@1 = mean
    assert not list(out.parent.glob(".*"))  # no temporary file left beside the JSON
