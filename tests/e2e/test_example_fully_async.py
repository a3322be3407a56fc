"""examples/fully_async/run.sh as a user runs it, for 3 steps on CPU: fully async training on the
long-tailed workload never trains on a sample more than --max-staleness versions old, does overlap
(some data is older than the policy), and the responses really have the long tail long_tail.py draws."""

import importlib.util
import json
import os
import statistics
import subprocess

import pytest
from conftest import REPO

pytestmark = pytest.mark.e2e

STEPS, MAX_STALENESS, MAX_LEN = 3, 2, 128
_spec = importlib.util.spec_from_file_location("long_tail", REPO / "examples" / "fully_async" / "long_tail.py")
long_tail = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(long_tail)
response_budget = long_tail.response_budget


# slow (suite time, issue 24): full async with its staleness bound runs by default in test_train_loops.py
@pytest.mark.slow
def test_fully_async_example_bounds_staleness_on_a_long_tail(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(["bash", str(REPO / "examples/fully_async/run.sh"), "--num-rollout", str(STEPS),
                             "--rollout-max-response-len", str(MAX_LEN), "--no-tensorboard"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = tmp_path / "run-full"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["rollout/samples"] == 64 for r in rows)
    assert all(r["train/staleness_max"] <= MAX_STALENESS for r in rows), [r["train/staleness_max"] for r in rows]
    assert any(r["train/staleness_max"] >= 1 for r in rows)  # the trainer did train while generation went on
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)  # every update reached the engine

    samples = [json.loads(line) for step in range(STEPS)
               for line in (run / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    for step in range(STEPS):  # the dumps are the batches trained: per token, at most MAX_STALENESS old
        for line in (run / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines():
            assert min(json.loads(line)["weight_versions"]) >= step - MAX_STALENESS
    lengths = [s["response_length"] for s in samples]
    long = [s for s in samples if response_budget(s["index"], MAX_LEN)[1]]
    # long ones ignore EOS: exactly their budget; short ones stop at theirs or earlier
    assert all(s["response_length"] == response_budget(s["index"], MAX_LEN)[0] for s in long)
    assert all(s["response_length"] <= 12 for s in samples if s not in long)
    # long-tailed: a few samples (not none, not most) at 5x the median or more
    median = statistics.median(lengths)
    tail = [n for n in lengths if n >= 5 * median]
    assert 1 <= len(tail) <= 0.2 * len(samples), (median, sorted(lengths)[-10:])
