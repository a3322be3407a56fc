"""A run that heals a lost trainer (lean_rl/trainer_heal.py): a rank killed (kill -9), a rank hung in a
collective past the call deadline (SIGSTOP), a whole node removed from the simulated cluster: each time
the run finishes all its steps without a person, every prompt trained exactly once (from the dumped
samples), every trained token from the version the step trained (or within the staleness bound), and the
engines are the same processes throughout."""

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import assert_each_prompt_trained_once, read_metrics, run_flags, run_lean_rl, wait_node_alive

from lean_rl.testing.watched_run import WatchedRun

pytestmark = pytest.mark.e2e

STEPS, BATCH = 6, 8  # steps of a second or two: the fault comes right after step 1, well before the end


def _listener_pid(port: int) -> int | None:
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
            return conn.pid
    return None


def run_with_a_fault(tmp_path: Path, flags: list[str], fault, module: str = "lean_rl.train",
                     timeout_s: float = 420) -> tuple[str, list[dict], float]:
    """Start the run, wait for step 1 to be logged, `fault(log_text, rank_pids)` at once (while step 2 runs), let
    it finish; returns (its log, its metrics, seconds from the fault to the end of the heal)."""
    with WatchedRun(module, flags, tmp_path / "run.log") as run:
        pids = run.rank_pids()
        engine_port = int(run.wait_for(r"engines \['http://[0-9.]+:(\d+)'", 240).group(1))
        engine_pid = _listener_pid(engine_port)
        run.wait_for(r"\nstep 1 \|", 300)
        fault(run.text(), pids)
        faulted = time.monotonic()
        run.wait_for(r"trainer healed in", 300)
        healed_s = time.monotonic() - faulted
        assert _listener_pid(engine_port) == engine_pid, "the engine was restarted by the heal"
        code = run.wait(timeout_s)
        text = run.text()
    assert code == 0, text[-5000:]
    return text, read_metrics(tmp_path), healed_s


def _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows, in_order=True, max_staleness=0):
    assert [r["step"] for r in rows] == list(range(STEPS)), text[-3000:]  # each step once in the metrics
    assert rows[-1]["fault/trainer_restarts"] == 1
    assert rows[-1]["engines/restarts"] == 0
    healed = [r for r in rows if "fault/heal_seconds" in r]
    assert len(healed) == 1 and healed[0]["fault/heal_seconds"] > 0
    _assert_each_step_trained_its_own_version(tmp_path, tiny_qwen2, toy_data, in_order, max_staleness)


def _assert_each_step_trained_its_own_version(tmp_path, tiny_qwen2, toy_data, in_order=True, max_staleness=0):
    assert_each_prompt_trained_once(tmp_path, tiny_qwen2, toy_data, STEPS, BATCH, in_order=in_order)
    for step in range(STEPS):  # no token of a version the heal undid, none staler than the bound
        for line in (tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines():
            versions = [v for v in json.loads(line)["weight_versions"] if v >= 0]
            assert versions and all(step - max_staleness <= v <= step for v in versions), (step, versions)


def _kill_rank_1(_log, pids):
    os.kill(pids[1], signal.SIGKILL)


def test_kill_9_of_a_trainer_rank_heals_and_the_run_finishes(tiny_qwen2, toy_data, tmp_path):
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(tmp_path / "ckpt"),
                      "--save-interval", "1", "--dump-samples-interval", "1", "--micro-batch-size", "8",
                      "--actor-num-procs-per-node", "2")
    text, rows, healed_s = run_with_a_fault(tmp_path, flags, _kill_rank_1)
    print(f"kill -9 of rank 1: healed {healed_s:.1f} s after the fault;",
          [line for line in text.splitlines() if "trainer healed in" in line][-1])
    _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows)


@pytest.mark.slow
def test_a_spent_restart_budget_stops_the_run_with_one_line_and_the_rerun_resumes(tiny_qwen2, toy_data, tmp_path):
    """--max-trainer-restarts 1: rank 1 killed after step 1 heals; killed again after the heal, the run ends
    with one line naming the spent budget; the same command then resumes from the last checkpoint and
    finishes, every prompt trained once across the three trainers."""
    ckpt = tmp_path / "ckpt"
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(ckpt),
                      "--load", str(ckpt), "--save-interval", "1", "--dump-samples-interval", "1",
                      "--micro-batch-size", "8", "--actor-num-procs-per-node", "2", "--max-trainer-restarts", "1")
    with WatchedRun("lean_rl.train", flags, tmp_path / "run.log") as run:
        pids = run.rank_pids()
        run.wait_for(r"\nstep 1 \|", 300)
        os.kill(pids[1], signal.SIGKILL)
        healed = run.wait_for(r"trainer healed in", 300)
        run.wait_for(r"\nstep 3 \|", 300, after=healed.end())
        os.kill(run.rank_pids()[1], signal.SIGKILL)  # the healed group's rank 1: the budget is spent
        code = run.wait(300)
        text = run.text()
    ended = [line for line in text.splitlines() if "the run stops" in line]
    assert code != 0 and len(ended) == 1, text[-4000:]
    assert "1 trainer restart(s) used (--max-trainer-restarts 1)" in ended[0] and "rank 1" in ended[0], ended
    print("the run ended with:", ended[0])
    healed_rows = [r for r in read_metrics(tmp_path) if "fault/heal_seconds" in r]
    assert len(healed_rows) == 1 and healed_rows[0]["fault/trainer_restarts"] == 1

    resumed = run_lean_rl("lean_rl.train", flags)  # the same command again
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    assert f"resumed from {ckpt} at step" in resumed.stdout + resumed.stderr
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS)), rows  # each step once across heal and rerun
    assert [r for r in rows if "fault/heal_seconds" in r] == healed_rows
    _assert_each_step_trained_its_own_version(tmp_path, tiny_qwen2, toy_data)


@pytest.mark.slow
def test_a_hung_rank_past_the_call_deadline_heals(tiny_qwen2, toy_data, tmp_path):
    stopped = []

    def hang_rank_1(_log, pids):
        os.kill(pids[1], signal.SIGSTOP)  # a rank that stops answering: its peer waits in the collective
        stopped.append(pids[1])

    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(tmp_path / "ckpt"),
                      "--save-interval", "1", "--dump-samples-interval", "1", "--micro-batch-size", "8",
                      "--actor-num-procs-per-node", "2", "--trainer-call-timeout", "40")
    try:
        text, rows, healed_s = run_with_a_fault(tmp_path, flags, hang_rank_1)
    finally:
        for pid in stopped:  # killed by the heal; if not, do not leave it stopped
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "did not finish within 40s" in text, text[-4000:]
    print(f"rank hung past --trainer-call-timeout 40: healed {healed_s:.1f} s after the fault")
    _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one-step", "full"])
def test_async_loops_heal_a_killed_rank(mode, tiny_qwen2, toy_data, tmp_path):
    staleness = ["--max-staleness", "1"] if mode == "full" else []
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(tmp_path / "ckpt"),
                      "--save-interval", "1", "--dump-samples-interval", "1", "--micro-batch-size", "8",
                      "--actor-num-procs-per-node", "2", "--async-mode", mode, *staleness)
    text, rows, healed_s = run_with_a_fault(tmp_path, flags, _kill_rank_1, module="lean_rl.train_async")
    print(f"--async-mode {mode}, kill -9 of rank 1: healed {healed_s:.1f} s after the fault")
    _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows, in_order=mode != "full", max_staleness=1)


@pytest.mark.slow
def test_a_colocated_run_heals_into_the_placement_group_its_engines_live_in(tiny_qwen2, toy_data, tmp_path):
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(tmp_path / "ckpt"),
                      "--save-interval", "1", "--dump-samples-interval", "1", "--micro-batch-size", "8",
                      "--actor-num-procs-per-node", "2", "--colocate")
    text, rows, healed_s = run_with_a_fault(tmp_path, flags, _kill_rank_1)
    print(f"--colocate, kill -9 of rank 1: healed {healed_s:.1f} s after the fault")
    _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows)


@pytest.mark.slow
def test_ppo_heals_actor_and_critic(tiny_qwen2, toy_data, tmp_path):
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(tmp_path / "ckpt"),
                      "--save-interval", "1", "--dump-samples-interval", "1", "--micro-batch-size", "8",
                      "--advantage-estimator", "ppo")
    text, rows, _ = run_with_a_fault(tmp_path, flags, lambda _log, pids: os.kill(pids[0], signal.SIGKILL))
    assert "critic" in text and "trainer healed in" in text
    _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows)


@pytest.mark.slow
def test_a_lost_node_heals_on_the_nodes_left(simulated_cluster, tiny_qwen2, toy_data, tmp_path):
    """A trainer node's Ray processes killed mid-step (the node gone), brought back 30 s later: the heal
    places the trainer on the nodes alive (or waits for the node), the engine elsewhere untouched."""
    cluster = simulated_cluster
    killed, back = [], []

    def remove_a_trainer_node(log, _pids):
        nodes = [ip.strip(" '\"") for ip in re.search(r"trainer ranks on nodes \[(.*?)\]", log).group(1).split(",")]
        engines = set(re.findall(r"http://([0-9.]+):", re.search(r"engines \[.*?\] and router", log).group(0)))
        head = next(n.ip for n in cluster.nodes if n.head)
        victim = next(ip for ip in reversed(nodes) if ip != head and ip not in engines)
        cluster.kill_node(victim)
        killed.append(victim)
        back.append(threading.Timer(30, cluster.restart_node, args=(victim,)))
        back[-1].start()

    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--save", str(tmp_path / "ckpt"),
                      "--save-interval", "1", "--dump-samples-interval", "1", "--micro-batch-size", "8",
                      "--ray-address", cluster.address, "--actor-num-nodes", "2", "--tensor-model-parallel-size", "2")
    try:
        text, rows, healed_s = run_with_a_fault(tmp_path, flags, remove_a_trainer_node, timeout_s=600)
    finally:
        for timer, ip in zip(back, killed):
            timer.join()
            wait_node_alive(cluster.address, ip)
    assert f"node {killed[0]} is lost" in text, text[-4000:]
    print(f"node {killed[0]} lost: healed {healed_s:.1f} s after the fault")
    _assert_healed(tmp_path, tiny_qwen2, toy_data, text, rows)


@pytest.mark.slow
def test_healing_is_off_without_save(tiny_qwen2, toy_data, tmp_path):
    """No checkpoint to go back to: start-up says healing is off, and a lost rank ends the run naming it."""
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--micro-batch-size", "8",
                      "--actor-num-procs-per-node", "2")
    with WatchedRun("lean_rl.train", flags, tmp_path / "run.log") as run:
        pids = run.rank_pids()
        run.wait_for(r"\nstep 0 \|", 300)
        os.kill(pids[1], signal.SIGKILL)
        code = run.wait(240)
        text = run.text()
    assert "trainer healing off (no --save" in text
    assert code != 0 and "healing off (no --save" in text.split("trainer healing off")[-1], text[-3000:]
