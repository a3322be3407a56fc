"""kill -9 the driver mid-run, rerun the same command: it continues from the last checkpoint, no prompt
is lost or repeated, the metrics continue, and the killed run left no engine or trainer behind."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import transformers
from conftest import REPO, read_metrics, run_flags, run_lean_rl

from lean_rl.buffer.prompt_source import PromptSource, load_prompts
from lean_rl.buffer.config import DataConfig

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

    # every step trained on BATCH fresh prompts; across the killed and the resumed run, each prompt of
    # the shuffled order was trained on exactly once (steps >= SAVE_EVERY were redone and re-dumped)
    trained = []
    for step in range(STEPS):
        lines = (tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        groups = {(s["metadata"]["epoch"], s["metadata"]["prompt_row"]) for s in map(json.loads, lines)}
        assert len(groups) == BATCH
        trained += sorted(groups)
    assert len(set(trained)) == len(trained) == STEPS * BATCH
    data = DataConfig(prompt_data=str(toy_data / "train.jsonl"))
    records, _ = load_prompts(data.prompt_data, data, transformers.AutoTokenizer.from_pretrained(tiny_qwen2))
    source = PromptSource(records, shuffle=True, seed=42)
    expected = {(0, source.next()[1].row) for _ in range(STEPS * BATCH)}
    assert set(trained) == expected  # none lost: exactly the first STEPS * BATCH prompts of the order

    # once more: the run is complete, so it says so and starts no engine, and the metrics stay as they are
    assert "engines serve the trainer's weights" in resumed.stderr + resumed.stdout
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    log = result.stderr + result.stdout
    assert f"is at step {STEPS}, --num-rollout is {STEPS}: nothing left to train" in log
    assert "engines serve the trainer's weights" not in log
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(STEPS))
