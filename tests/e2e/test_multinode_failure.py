"""A node that dies mid-run: the run on a (simulated) cluster ends, non-zero and within bounded time,
with a message naming the lost node; once the node is back, the same command resumes from the last
checkpoint and finishes, every prompt trained exactly once across both runs."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO, assert_each_prompt_trained_once, read_metrics, run_flags, run_lean_rl, wait_node_alive

pytestmark = pytest.mark.e2e

STEPS, BATCH = 4, 8

# slow (suite time, issue 24): multi-node runs by default in test_multinode.py, engine loss and recovery in test_engine_faults.py
@pytest.mark.slow
def test_node_lost_mid_run_then_resume(simulated_cluster, tiny_qwen2, toy_data, tmp_path):
    cluster = simulated_cluster
    ckpt = tmp_path / "ckpt"
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(ckpt),
                      "--load", str(ckpt), "--save-interval", "1", "--dump-samples-interval", "1",
                      "--micro-batch-size", "8", "--ray-address", cluster.address, "--actor-num-nodes", "2",
                      "--tensor-model-parallel-size", "2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        driver = subprocess.Popen([sys.executable, "-m", "lean_rl.train", *flags], cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    killed = None
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and any(json.loads(line)["step"] >= 1
                                            for line in metrics.read_text().splitlines() if line)):
            assert driver.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run made no progress:\n" + log_path.read_text()[-3000:]
            time.sleep(0.5)
        output = log_path.read_text()
        found = re.search(r"trainer ranks on nodes \[(.*?)\]", output)
        assert found, "the run does not log where its trainer ranks are"
        nodes = [ip.strip(" '\"") for ip in found.group(1).split(",")]
        started = re.search(r"engines \[.*?\] and router", output)
        engines = set(re.findall(r"http://([0-9.]+):", started.group(0))) if started else set()
        head = next(n.ip for n in cluster.nodes if n.head)
        # the node of rank 1, else of rank 0: not the head (it holds the cluster), an engine's only if need be
        candidates = [ip for ip in reversed(nodes) if ip != head]
        killed = next((ip for ip in candidates if ip not in engines), candidates[0])
        cluster.kill_node(killed)
        killed_at = time.monotonic()
        try:
            code = driver.wait(180)
        except subprocess.TimeoutExpired:
            pytest.fail("the run did not end within 180 s of losing a node:\n" + log_path.read_text()[-5000:])
        elapsed = time.monotonic() - killed_at
        output = log_path.read_text()
        assert code != 0, output[-5000:]
        assert f"node {killed} is lost" in output, output[-5000:]
        print(f"run ended {elapsed:.0f} s after the node loss; its error:",
              [line for line in output.splitlines() if f"node {killed} is lost" in line][-1])
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
        if killed is not None:
            cluster.restart_node(killed)
            wait_node_alive(cluster.address, killed)

    saved = max(int(p.name.removeprefix("iter_")) for p in ckpt.glob("iter_*"))
    assert 2 <= saved < STEPS
    started = time.monotonic()
    resumed = run_lean_rl("lean_rl.train", flags, timeout_s=300)
    print(f"resumed run: {time.monotonic() - started:.0f} s")
    log = resumed.stderr + resumed.stdout
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed from {ckpt} at step {saved}" in log
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(STEPS))  # each step once

    assert_each_prompt_trained_once(tmp_path, tiny_qwen2, toy_data, STEPS, BATCH)
