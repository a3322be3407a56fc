"""The Python API as a notebook uses it: examples/python_api.py's main called twice in one process (the
synchronous loop, then the one-step async one from inside a running event loop, as a Jupyter cell
calls it), each starting and closing its own Ray, SGLang engine,
router and Megatron trainer on the tiny model, with the reward and the loss given as Python functions
(the loss a lambda that runs on the trainer's Ray actor). Slow (tests/slow_tiers.py, "e2e"): two runs."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

pytestmark = pytest.mark.e2e


@pytest.mark.slow
def test_python_api_example_runs_twice_in_one_process_once_inside_an_event_loop(tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, json, runpy
        example = runpy.run_path("examples/python_api.py", run_name="python_api_example")

        async def in_a_notebook():  # a Jupyter cell runs inside an event loop: train() runs on a thread
            return example["main"](["--num-rollout", "2", "--out", {str(tmp_path / 'async')!r},
                                    "--async-mode", "one-step"])

        runs = [example["main"](["--num-rollout", "2", "--out", {str(tmp_path / 'sync')!r}]),
                asyncio.run(in_a_notebook())]
        open({str(tmp_path / 'runs.json')!r}, "w").write(json.dumps(runs))
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    runs = json.loads((tmp_path / "runs.json").read_text())
    for name, rows in zip(("sync", "async"), runs):
        assert [row["step"] for row in rows] == [0, 1]
        # what train() returned is what the run logged
        logged = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        assert rows == logged
        for row in rows:
            assert 0.0 <= row["rollout/reward_mean"] <= 1.0 and row["rollout/reward_std"] > 0  # the Python reward
            assert row["train/python_loss_calls"] == pytest.approx(1.0)  # the lambda ran on the rank
    assert result.stdout.count("\nstep  reward\n") == 2  # the curve, printed after each run
    # each ran its own loop: only the async one measures how old the trained samples were
    assert "train/staleness_max" not in runs[0][1] and runs[1][1]["train/staleness_max"] >= 1.0
