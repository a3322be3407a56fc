"""examples/openai_agent/run.sh as a user runs it, for 2 steps on CPU: an unmodified openai-client agent
makes the rollouts through the capture endpoint, and the run trains on them."""

import json
import os
import subprocess

import pytest
from conftest import REPO, read_metrics

pytestmark = pytest.mark.e2e

STEPS = 2


def test_the_openai_agent_example_trains(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(["bash", str(REPO / "examples/openai_agent/run.sh"), "--num-rollout", str(STEPS),
                             "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-tensorboard"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["rollout/samples"] == 16 and r.get("rollout/generate_failed", 0) == 0 for r in rows)
    assert all(0.0 <= r["rollout/reward_mean"] <= 1.0 for r in rows)
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)  # trained weights reached the engines
    for step in range(STEPS):
        samples = [json.loads(line) for line in
                   (tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(samples) == 16
        for s in samples:
            calls = s["metadata"]["capture_calls"]
            assert len(calls) == 2 and s["metadata"]["trajectory_parts"] == 1  # two turns, one sample
            n1, ctx, n2 = calls[0]["completion_tokens"], calls[1]["context_tokens"], calls[1]["completion_tokens"]
            assert ctx > 0 and s["loss_mask"] == [1] * n1 + [0] * ctx + [1] * n2
            assert len(s["tokens"]) - s["response_length"] == calls[0]["prompt_tokens"]
            assert s["status"] in ("completed", "truncated") and s["reward"] is not None
            assert {v for v, m in zip(s["weight_versions"], s["loss_mask"]) if m} == {step}  # on-policy, sync


@pytest.mark.slow
def test_the_calculator_agent_trains(tmp_path):
    """AGENT=calculator: the tool-calling task as an openai agent (its tools sent through the endpoint,
    its tool code run in the sandbox), the reward set by the rollout code."""
    env = {**os.environ, "OUT": str(tmp_path), "AGENT": "calculator", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", str(REPO / "examples/openai_agent/run.sh"), "--num-rollout", str(STEPS),
                             "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--micro-batch-size", "4",
                             "--no-tensorboard"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS)) and all(r["rollout/samples"] == 4 for r in rows)
    from lean_rl.buffer.prompt_source import load_tokenizer

    tokenizer = load_tokenizer(str(tmp_path / "model"))
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples" / "step_000000.jsonl").read_text().splitlines()]
    for s in samples:
        assert s["reward"] in (0.0, 1.0) and s["metadata"]["capture_calls"]
        prompt = tokenizer.decode(s["tokens"][:len(s["tokens"]) - s["response_length"]])
        assert '"name": "python"' in prompt and "<tools>" in prompt  # the agent's tools reached the model
