"""kill -9 the driver mid-run, rerun the same command: it continues from the last checkpoint, no prompt
is lost or repeated, the metrics continue, and the killed run left no engine or trainer behind."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, assert_each_prompt_trained_once, read_metrics, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e

STEPS, SAVE_EVERY, BATCH = 8, 3, 8


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_kill_9_and_rerun_resumes_exactly(tiny_qwen2, toy_data, tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(ckpt),
                      "--load", str(ckpt), "--save-interval", str(SAVE_EVERY), "--dump-samples-interval", "1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "first.log").open("w")
    driver = subprocess.Popen([sys.executable, "-m", "lean_rl.train", *flags], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 400
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= SAVE_EVERY + 2):
        assert driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the first run made no progress"
        time.sleep(0.5)
    children = [p for p in _descendants(driver.pid) if "sglang" in " ".join(p.cmdline()) or
                "MegatronRank" in p.name() + " ".join(p.cmdline())]
    assert children, "expected engines and trainer ranks under the driver"
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    gone, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"left behind after kill -9: {[(p.pid, p.name()) for p in alive]}"
    killed_at = len(read_metrics(tmp_path))
    assert SAVE_EVERY + 2 <= killed_at < STEPS

    resumed = run_lean_rl("lean_rl.train", flags)  # the same command again
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed from {ckpt} at step {SAVE_EVERY}" in resumed.stderr + resumed.stdout
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))  # the metrics continue, each step once

    assert_each_prompt_trained_once(tmp_path, tiny_qwen2, toy_data, STEPS, BATCH)

    # once more: the run is complete, so it says so and starts no engine, and the metrics stay as they are
    assert "engines serve the trainer's weights" in resumed.stderr + resumed.stdout
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    log = result.stderr + result.stdout
    assert f"is at step {STEPS}, --num-rollout is {STEPS}: nothing left to train" in log
    assert "engines serve the trainer's weights" not in log
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(STEPS))
