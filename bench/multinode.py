"""The same tiny run on one simulated Ray node vs three, in one run of this script.

    .venv/bin/python bench/multinode.py [--steps 8]

Both runs: TP2 trainer (two ranks), one SGLang engine, GRPO on the toy task, `--ray-address` of a
simulated cluster (lean_rl/testing/ray_cluster.py: one Ray node per loopback address). One node: the
two ranks and the engine share 127.0.0.2. Three nodes: one rank on each of two nodes, the engine on
the third (one CPU per node forces it), so rendezvous, gloo, the weight-update group, the router and
the rollout cross node addresses. On one machine the ratio should be near 1: the point is that
nothing serialises through the driver or waits on a node. Each layout runs twice, in the order one, three,
three, one (a drift of the shared machine hits both alike). Reported over the steps after the first:
median step time, train time, sync time (incl. probe), generate time; ratio = three nodes / one node, its
noise the two layouts' step-to-step spreads (half their quartile distance over their median, summed);
beside the step time, the CPU the clusters' own Ray daemons (raylets, GCS, agents) used per measured step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.testing.ray_cluster import SimulatedCluster, actor_table
from lean_rl.testing.tiny_model import make_tiny_model
from lean_rl.testing.toy_task import write_dataset

REPO = Path(__file__).resolve().parents[1]
KEYS = ("time/step", "time/train", "time/sync", "time/generate")
QUICK = {"steps": 6}  # 2 runs x 5 steps measured per layout: with 1 x 3, one slow step moved the ratio by 0.3
DAEMONS = "daemon CPU s/step"
GOAL = "≈ 1"  # three nodes / one node: nothing serialises through the driver or waits on a node


def daemon_cpu_seconds(cluster: SimulatedCluster) -> float:
    """CPU seconds used so far by the cluster's Ray daemons (raylets, GCS, agents, log monitors): the
    processes of each node's `ray start` process group, except Ray's workers (titled `ray::...`), which
    run the trainer's ranks and the engine's actor, the run's own work."""
    import psutil

    groups = {node.pgid for node in cluster.nodes}
    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(proc.pid) not in groups or (proc.info["cmdline"] or [""])[0].startswith("ray::"):
                continue
            times = proc.cpu_times()
            total += times.user + times.system
        except (psutil.Error, ProcessLookupError):
            continue  # gone meanwhile
    return total


def run(name: str, cluster: SimulatedCluster, work: Path, model: Path, data: Path, args, extra: list[str]):
    out = work / name
    flags = ["--hf-checkpoint", str(model), "--output-dir", str(out), "--no-tensorboard", "--prompt-data",
             str(data), "--rollout-shuffle", "--num-rollout", str(args.steps),
             "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
             "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32",
             "--lr", "1e-4", "--micro-batch-size", "8", "--rollout-num-engines", "1",
             "--tensor-model-parallel-size", "2", "--ray-address", cluster.address, *extra]
    metrics = out / "metrics.jsonl"
    logs = out.with_suffix(".log")
    with open(logs, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lean_rl.train", *flags], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        # the daemons' CPU over the steps measured: from the first step's metrics line to the last one's
        deadline, marks = time.monotonic() + args.timeout, {}
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{name}: no end within --timeout {args.timeout} s (log: {logs})")
            done = metrics.read_text().count("\n") if metrics.is_file() else 0
            for mark in (1, args.steps):
                if done >= mark and mark not in marks:
                    marks[mark] = daemon_cpu_seconds(cluster)
            time.sleep(0.1)
        # the run may end between two polls after its last line: the daemons outlive it, so read them now
        daemons = (marks[args.steps] if args.steps in marks else daemon_cpu_seconds(cluster)) - marks.get(1, 0.0)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{logs.read_text()[-4000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line][1:]
    placement = sorted({(a["class"], a["ip"]) for a in actor_table(cluster.address)})
    # median: the sync time of a few steps jumps to 0.3-0.8 s on any layout (seen since the first runs)
    steps = {key: [r.get(key, 0.0) for r in rows] for key in KEYS}
    steps[DAEMONS] = [daemons / len(rows)]  # per step measured (steps 2..N)
    return steps, placement


def relative_spread(values: list[float]) -> float:
    """Half the distance between the quartiles of `values`, over their median."""
    low, median, high = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return (high - low) / 2 / median if median else 0.0


def main(argv: list[str]) -> int:
    parser = bench_parser("multinode", __doc__, QUICK)
    parser.add_argument("--steps", type=at_least(2), default=8, help="steps per run (the first is excluded)")
    parser.add_argument("--timeout", type=at_least(1), default=900, help="seconds per run")
    args = parse_bench_args(parser, argv)
    work = Path(tempfile.mkdtemp(prefix="lean_rl_bench_multinode_"))
    model = make_tiny_model(work / "model", preset="tiny")
    data = write_dataset(work / "train.jsonl", 512, seed=0)
    layouts = {"one_node": (1, 3, ["--actor-num-procs-per-node", "2"]), "three_nodes": (3, 1, ["--actor-num-nodes", "2"])}
    pooled: dict[str, dict[str, list[float]]] = {name: {} for name in layouts}
    placements = {}
    # one, three, three, one: a drift of this shared machine over the runs hits both layouts alike (by hand,
    # one run of each in a fixed order gave 0.75x and 1.43x on unchanged code)
    for number, name in enumerate(("one_node", "three_nodes", "three_nodes", "one_node")):
        nodes, cpus, flags = layouts[name]
        with SimulatedCluster(num_nodes=nodes, cpus_per_node=cpus) as cluster:
            steps, placements[name] = run(f"{name}_{number}", cluster, work, model, data, args, flags)
        for key, values in steps.items():
            pooled[name].setdefault(key, []).extend(values)
    single_steps, multi_steps = pooled["one_node"], pooled["three_nodes"]
    single_at, multi_at = placements["one_node"], placements["three_nodes"]
    single = {key: statistics.median(values) for key, values in single_steps.items()}
    multi = {key: statistics.median(values) for key, values in multi_steps.items()}
    print(f"\nper step, median of steps 2..{args.steps} of two runs each (tiny model, TP2 + 1 engine, 64 samples x <= 32 tokens)")
    print(f"  one node:    {single_at}\n  three nodes: {multi_at}")
    print(f"{'figure':16s} {'1 node s':>9s} {'3 nodes s':>10s} {'ratio':>7s}")
    # the ratio's noise: each layout's step-to-step spread (both runs share the 2 cores with the engine)
    noise = {key: relative_spread(multi_steps[key]) + relative_spread(single_steps[key]) for key in KEYS}
    for key in KEYS:
        print(f"{key:16s} {single[key]:9.3f} {multi[key]:10.3f} {multi[key] / single[key]:6.2f}x  (noise ±{noise[key]:.2f})")
    print(f"{DAEMONS:16s} {single[DAEMONS]:9.3f} {multi[DAEMONS]:10.3f}")
    daemons = (f"; the Ray daemons' CPU per step, 3 nodes / 1: {multi[DAEMONS]:.3f} / {single[DAEMONS]:.3f} s (they share "
               f"this machine's cores with the run)")
    command = command_line("multinode", argv)
    write_rows(args.json, [
        row(f"{key} of the same tiny run (TP2 + 1 engine) on 3 / 1 simulated Ray nodes, median of steps 2..{args.steps} "
            f"of two runs each (one, three, three, one)",
            f"{multi[key]:.3f} s", f"{single[key]:.3f} s on one node; noise ±{noise[key]:.2f} (the layouts' step-to-step "
            f"spreads){daemons if key == 'time/step' else ''}", multi[key] / single[key] if single[key] else None, GOAL,
            command, noise=noise[key])
        for key in KEYS])
    return 0


if __name__ == "__main__":
    run_bench("multinode", main)
