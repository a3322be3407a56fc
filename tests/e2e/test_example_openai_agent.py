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
