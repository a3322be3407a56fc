"""A node that dies mid-run on a (simulated) cluster, and stays away until the run is over. Healing on (the
default, lean_rl/trainer_heal.py): the run restarts its trainer on the nodes left from the last checkpoint and
finishes, each step logged once, every prompt trained exactly once. Healing off (--max-trainer-restarts 0):
the run ends, non-zero and within bounded time, with a message naming the lost node; once the node is back,
the same command resumes from the last checkpoint and finishes, every prompt trained exactly once across both
runs. (test_trainer_heal.py::test_a_lost_node_heals_on_the_nodes_left brings the node back during the heal.)"""

import re
import subprocess
import time

import pytest
from conftest import assert_each_prompt_trained_once, read_metrics, run_flags, run_lean_rl, wait_node_alive

from lean_rl.testing.watched_run import WatchedRun

pytestmark = pytest.mark.e2e

STEPS, BATCH = 4, 8


def _a_trainer_node(cluster, log: str) -> str:
    """The node of rank 1, else of rank 0: not the head (it holds the cluster), an engine's only if need be."""
    found = re.search(r"trainer ranks on nodes \[(.*?)\]", log)
    assert found, "the run does not log where its trainer ranks are"
    nodes = [ip.strip(" '\"") for ip in found.group(1).split(",")]
    started = re.search(r"engines \[.*?\] and router", log)
    engines = set(re.findall(r"http://([0-9.]+):", started.group(0))) if started else set()
    head = next(n.ip for n in cluster.nodes if n.head)
    candidates = [ip for ip in reversed(nodes) if ip != head]
    return next((ip for ip in candidates if ip not in engines), candidates[0])


# slow (suite time, issue 24): multi-node runs by default in test_multinode.py, engine loss and recovery in test_engine_faults.py
@pytest.mark.slow
@pytest.mark.parametrize("healing", ["on", "off"])
def test_node_lost_mid_run_then_resume(healing, simulated_cluster, tiny_qwen2, toy_data, tmp_path):
    cluster = simulated_cluster
    ckpt = tmp_path / "ckpt"
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(ckpt),
                      "--load", str(ckpt), "--save-interval", "1", "--dump-samples-interval", "1",
                      "--micro-batch-size", "8", "--ray-address", cluster.address, "--actor-num-nodes", "2",
                      "--tensor-model-parallel-size", "2",
                      *(["--max-trainer-restarts", "0"] if healing == "off" else []))
    killed = None
    try:
        with WatchedRun("lean_rl.train", flags, tmp_path / "first.log") as run:
            run.wait_for(r"\nstep 1 \|", 300)
            killed = _a_trainer_node(cluster, run.text())
            cluster.kill_node(killed)
            killed_at = time.monotonic()
            try:
                code = run.wait(300 if healing == "on" else 180)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the run did not end within bounded time of losing a node:\n{run.text()[-5000:]}")
            elapsed = time.monotonic() - killed_at
            output = run.text()
    finally:
        if killed is not None:
            cluster.restart_node(killed)
            wait_node_alive(cluster.address, killed)
    lost = [line for line in output.splitlines() if f"node {killed} is lost" in line]
    assert lost, output[-5000:]

    if healing == "on":
        assert code == 0, output[-5000:]
        healed = [line for line in output.splitlines() if "trainer healed in" in line]
        print(f"node {killed} lost, healing on: the run finished {elapsed:.0f} s after the loss;", healed)
        rows = read_metrics(tmp_path)
        assert [r["step"] for r in rows] == list(range(STEPS)), output[-3000:]  # each step once
        assert len(healed) == 1 and rows[-1]["fault/trainer_restarts"] == 1, (healed, rows[-1])
        assert len([r for r in rows if "fault/heal_seconds" in r]) == 1
        assert_each_prompt_trained_once(tmp_path, tiny_qwen2, toy_data, STEPS, BATCH)
        return

    assert code != 0, output[-5000:]
    stopped = [line for line in lost if "healing off (--max-trainer-restarts 0)" in line]
    assert stopped and "trainer healed" not in output, output[-5000:]
    print(f"node {killed} lost, healing off: the run ended {elapsed:.0f} s after the loss; its error:", stopped[-1])
    saved = max(int(p.name.removeprefix("iter_")) for p in ckpt.glob("iter_*"))
    assert 2 <= saved < STEPS
    started = time.monotonic()
    resumed = run_lean_rl("lean_rl.train", flags, timeout_s=300)  # the same command, the node back
    print(f"resumed run: {time.monotonic() - started:.0f} s")
    log = resumed.stderr + resumed.stdout
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed from {ckpt} at step {saved}" in log
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(STEPS))  # each step once
    assert not any("fault/trainer_restarts" in r for r in read_metrics(tmp_path))
    assert_each_prompt_trained_once(tmp_path, tiny_qwen2, toy_data, STEPS, BATCH)
