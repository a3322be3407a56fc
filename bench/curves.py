"""Cost curves, not single points: how each path's time grows with what it scales with, in one run.

    python bench/curves.py [--sizes tiny small base100m] [--engines 1 2 4] [--convert-sizes tiny small base100m]
                           [--concurrency 1 4 16 64] [--nodes 1 2 3] [--png bench/curves.png]

- weight sync vs model size: the distributed transport to 1 engine, each preset's seconds per sync (median
  of --rounds) beside its raw-TCP floor (bench/weight_sync.py's Floor, the same rounds, alternating);
- weight sync vs engine count: the largest --sizes preset to the first 1, 2, 4 engines of one engine
  group (the same engines, so only the count changes), beside the floor to as many receivers;
- conversion vs size: hf->megatron and megatron->hf per preset beside the raw read + write of the same
  bytes, both from the same page cache (bench/convert.py measure_pair);
- rollout vs concurrency: tok/s of our rollout and of the same bare /generate requests
  (bench/rollout_throughput.py's rounds) at each --concurrency, 2 engines, the same servers;
- step time vs simulated Ray nodes: the same TP2 + 1 engine run (bench/multinode.py) on 1, 2, 3 nodes
  (2 nodes: one rank per node, the engine beside one of them).
Every row is a curve (its points in `figure` and `floor`); `ratio` is its growth over the range (last point
/ first). The PNG plots them all; docs/performance.md reads them for GPU clusters.
The 500M preset (base500m) is in the choices; --quick leaves it out (see docs/performance.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
from pathlib import Path

from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, work_dir_with_ray, write_rows
from curves_plot import plot_curves

SIZES = ("tiny", "small", "base100m", "base500m")
QUICK = {"sizes": ["tiny", "small", "base100m"], "engines": [1, 2, 4], "convert_sizes": ["tiny", "small", "base100m"],
         "concurrency": [1, 8, 64], "nodes": [1, 2, 3], "rounds": 2, "steps": 5}
BUFFER = 512 * 1024**2


def sync_curves(args, work: Path) -> dict:
    """{"size": [(preset, MB, ours s, floor s)], "engines": [(n, ours s, floor s)]}."""
    from safetensors.torch import load_file

    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.options import build
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync
    from weight_sync import Floor

    def measure(trainer, urls, api_key, state_dict, preset) -> tuple[float, float, float]:
        cfg = build(WeightSyncConfig, transport="distributed", buffer_size_bytes=BUFFER, timeout_s=1800,
                    disk_dir=str(work / f"sync-{preset}"))
        floor = Floor("distributed", state_dict, len(urls), args.rounds + 1, BUFFER, work)
        ours, floors = [], []
        try:
            with WeightSync.create(cfg, trainer, urls, api_key=api_key) as sync:
                sync.update(0)
                floor.once()
                for step in range(1, args.rounds + 1):
                    report = sync.update(step)
                    ours.append(report.seconds)
                    floors.append(floor.once())
        finally:
            floor.close()
        return report.bytes / 1e6, statistics.median(ours), statistics.median(floors)

    out: dict = {"size": [], "engines": []}
    largest = args.sizes[-1]
    for preset in args.sizes:
        served = make_tiny_model(work / f"{preset}-s0", arch="qwen2", seed=0, preset=preset)
        trained = make_tiny_model(work / f"{preset}-s1", arch="qwen2", seed=1, preset=preset)
        state_dict = load_file(str(trained / "model.safetensors"))
        counts = sorted(set(args.engines)) if preset == largest else [1]
        config = engine_config_for_tests(served, "--rollout-num-engines", str(max(counts)))
        with EngineGroup(config, work / f"engines-{preset}") as engines, \
                MegatronGroup.from_hf_checkpoint(trained, ParallelConfig(), call_timeout_s=1800) as trainer:
            for n in counts:
                mbytes, ours, floor = measure(trainer, engines.engine_urls[:n], config.api_key, state_dict, preset)
                print(f"  sync {preset} ({mbytes:.1f} MB) -> {n} engine(s): ours {ours:.3f} s, floor {floor:.3f} s",
                      flush=True)
                if n == 1:
                    out["size"].append((preset, mbytes, ours, floor))
                if preset == largest:
                    out["engines"].append((n, ours, floor))
        del state_dict
    return out


def convert_curve(args, work: Path) -> list[tuple]:
    """[(preset, MB, hf->megatron s, its floor s, megatron->hf s, its floor s, then the same four as CPU seconds,
    then the two floors' spreads between rounds)]."""
    from convert import measure_pair, prepare_input

    points = []
    for preset in args.convert_sizes:
        hf = prepare_input(work / "convert", "qwen2", "100MB", preset)
        mbytes = sum(p.stat().st_size for p in hf.glob("*.safetensors")) / 1e6
        megatron = work / "convert" / f"{preset}-megatron"
        to_meg, raw_hf = measure_pair("hf_to_megatron", hf, megatron, work / "convert" / "raw_hf", "100MB",
                                      args.rounds, "warm")
        to_hf, raw_dist = measure_pair("megatron_to_hf", megatron, work / "convert" / f"{preset}-hf", work / "convert" /
                                       "raw_dist", "100MB", args.rounds, "warm")
        points.append((preset, mbytes, to_meg["seconds"], raw_hf["seconds"], to_hf["seconds"], raw_dist["seconds"],
                       to_meg["cpu_seconds"], raw_hf["cpu_seconds"], to_hf["cpu_seconds"], raw_dist["cpu_seconds"],
                       raw_hf["spread"], raw_dist["spread"]))
        print(f"  convert {preset} ({mbytes:.0f} MB): hf->megatron {to_meg['seconds']:.2f} s, CPU "
              f"{to_meg['cpu_seconds']:.2f} s (floor {raw_hf['seconds']:.2f} s, CPU {raw_hf['cpu_seconds']:.2f} s, "
              f"spread {raw_hf['spread']:.0%}), megatron->hf {to_hf['seconds']:.2f} s, CPU {to_hf['cpu_seconds']:.2f} s "
              f"(floor {raw_dist['seconds']:.2f} s, CPU {raw_dist['cpu_seconds']:.2f} s, spread "
              f"{raw_dist['spread']:.0%})", flush=True)
    return points


def rollout_curve(args, work: Path) -> list[tuple]:
    """[(concurrency, ours tok/s, floor tok/s)], 2 tiny engines, 16 prompts x 4 samples x 32 tokens."""
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.buffer.data_buffer import create_data_buffer
    from lean_rl.buffer.prompt_source import load_tokenizer
    from lean_rl.config import parse_config
    from lean_rl.extensions import install as install_hooks
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.utils.gc_heap import freeze_startup_heap
    from rollout_throughput import floor_round, ours_round, write_prompts

    prompts, samples, tokens = 16, 4, 32
    model = make_tiny_model(work / "rollout-model", preset="tiny")
    path = write_prompts(work / "prompts.jsonl", prompts)
    engines_cfg = engine_config_for_tests(model, "--rollout-num-engines", "2")
    tokenizer = load_tokenizer(str(model))
    ids = [tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"]
           for line in path.read_text().splitlines()]
    points = []
    with EngineGroup(engines_cfg, work / "rollout-engines") as engines:
        freeze_startup_heap()  # as run_loop.run does once a run has started (and rollout_throughput.py)
        headers = engines_cfg.auth_headers()
        for concurrency in args.concurrency:
            cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(path), "--rollout-batch-size",
                                str(prompts), "--n-samples-per-prompt", str(samples), "--rollout-max-response-len",
                                str(tokens), "--rollout-ignore-eos", "--rollout-max-concurrency", str(concurrency),
                                "--rm-type", "exact"])
            cfg = dataclasses.replace(cfg, engines=engines_cfg)
            install_hooks(cfg)
            params = cfg.rollout.sampling.to_sglang()
            asyncio.run(floor_round(engines.router_url, ids[:2], 1, params, concurrency, headers))  # warm-up
            ours, floor = [], []
            for _ in range(args.rounds):
                seconds, made = asyncio.run(ours_round(cfg, create_data_buffer(cfg)))
                ours.append(made / seconds)
                seconds, made = asyncio.run(floor_round(engines.router_url, ids, samples, params, concurrency, headers))
                floor.append(made / seconds)
            points.append((concurrency, statistics.median(ours), statistics.median(floor)))
            print(f"  rollout concurrency {concurrency}: ours {points[-1][1]:.0f} tok/s, floor {points[-1][2]:.0f} tok/s",
                  flush=True)
    return points


def nodes_curve(args, work: Path) -> list[tuple]:
    """[(nodes, step s, train s, sync s, generate s, step-time spread)]: the same TP2 + 1 engine run on 1..3
    simulated nodes, medians over the steps after the first (the spread: multinode.relative_spread)."""
    from lean_rl.testing.ray_cluster import SimulatedCluster
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.testing.toy_task import write_dataset
    from multinode import relative_spread, run

    model = make_tiny_model(work / "nodes-model", preset="tiny")
    data = write_dataset(work / "nodes-train.jsonl", 512, seed=0)
    run_args = argparse.Namespace(steps=args.steps, timeout=900)
    points = []
    for n in args.nodes:
        layout = ["--actor-num-procs-per-node", "2"] if n == 1 else ["--actor-num-nodes", "2"]
        # 3 CPUs in all whatever the count: two ranks and the engine (one node: all three; two: a rank and the engine
        # on the first, the other rank on the second; three: one each)
        cpus = {1: 3, 2: 2}.get(n, 1)
        with SimulatedCluster(num_nodes=n, cpus_per_node=cpus) as cluster:
            steps, _ = run(f"nodes{n}", cluster, work, model, data, run_args, layout)
        times = {key: statistics.median(values) for key, values in steps.items()}
        points.append((n, times["time/step"], times["time/train"], times["time/sync"], times["time/generate"],
                       relative_spread(steps["time/step"])))
        print(f"  {n} node(s): step {times['time/step']:.3f} s (train {times['time/train']:.3f}, sync "
              f"{times['time/sync']:.3f}, generate {times['time/generate']:.3f})", flush=True)
    return points


def _points(values, fmt) -> str:
    return ", ".join(fmt(v) for v in values)


def rows_of(curves: dict, args, command: str) -> list[dict]:
    rows = []
    if curves.get("size"):
        size = curves["size"]
        rows.append(row(f"weight sync vs model size, distributed → 1 engine, median of {args.rounds}; ratio: last / first",
                        _points(size, lambda p: f"{p[0]} {p[1]:.0f} MB {p[2]:.3f} s"),
                        _points(size, lambda p: f"{p[3]:.3f} s") + " raw TCP", size[-1][2] / size[0][2], NO_GOAL, command))
    if curves.get("engines"):
        eng = curves["engines"]
        rows.append(row(f"weight sync vs engine count, {args.sizes[-1]}, distributed; ratio: {eng[-1][0]} engines / 1",
                        _points(eng, lambda p: f"{p[0]}: {p[1]:.3f} s"),
                        _points(eng, lambda p: f"{p[0]}: {p[2]:.3f} s") + " raw TCP to as many receivers",
                        eng[-1][1] / eng[0][1], NO_GOAL, command))
    if curves.get("convert"):
        conv = curves["convert"]
        for name, ours, floor, spread in (("hf->megatron", 2, 3, 10), ("megatron->hf", 4, 5, 11)):
            cpu = (lambda p: f", CPU {p[ours + 4]:.2f} s") if len(conv[-1]) > spread else (lambda p: "")
            cpu_floor = ((lambda p: f" (CPU {p[floor + 4]:.2f} s, spread {p[spread]:.0%})") if len(conv[-1]) > spread
                         else (lambda p: ""))
            rows.append(row(f"conversion {name} vs size, median of {args.rounds} after an untimed round (same page "
                            f"cache as the floor); ratio: last / floor at the largest",
                            _points(conv, lambda p: f"{p[0]} {p[1]:.0f} MB {p[ours]:.2f} s{cpu(p)}"),
                            _points(conv, lambda p: f"{p[floor]:.2f} s{cpu_floor(p)}") + " raw read + write",
                            conv[-1][ours] / conv[-1][floor], NO_GOAL, command))
    if curves.get("rollout"):
        roll = curves["rollout"]
        rows.append(row("rollout vs concurrency (tiny, 2 engines, 16×4 requests × 32 tokens); ratio: floor / ours at "
                        f"the highest, median of {args.rounds}",
                        _points(roll, lambda p: f"c{p[0]}: {p[1]:.0f} tok/s"),
                        _points(roll, lambda p: f"c{p[0]}: {p[2]:.0f}") + " tok/s bare /generate",
                        roll[-1][2] / roll[-1][1], NO_GOAL, command))
    if curves.get("nodes"):
        nodes = curves["nodes"]
        rows.append(row(f"step time vs simulated Ray nodes (tiny, TP2 + 1 engine, median of steps 2..{args.steps}); "
                        f"ratio: {nodes[-1][0]} nodes / 1",
                        _points(nodes, lambda p: f"{p[0]}: {p[1]:.2f} s"),
                        _points(nodes, lambda p: f"{p[0]}: train {p[2]:.2f} sync {p[3]:.2f} gen {p[4]:.2f}"),
                        nodes[-1][1] / nodes[0][1], "≈ 1", command, noise=nodes[-1][5] + nodes[0][5]))
    return rows


def main(argv: list[str]) -> int:
    parser = bench_parser("curves", __doc__, QUICK)
    parser.add_argument("--sizes", nargs="*", default=["tiny", "small", "base100m", "base500m"], choices=SIZES)
    parser.add_argument("--engines", nargs="+", type=at_least(1), default=[1, 2, 4])
    parser.add_argument("--convert-sizes", nargs="*", default=list(SIZES), choices=SIZES)
    parser.add_argument("--concurrency", nargs="*", type=at_least(1), default=[1, 4, 16, 64])
    parser.add_argument("--nodes", nargs="*", type=at_least(1), default=[1, 2, 3], choices=[1, 2, 3])
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--steps", type=at_least(2), default=5, help="steps per node-count run (the first excluded)")
    parser.add_argument("--png", default=str(Path(__file__).resolve().parent / "curves.png"), help="where the plot goes")
    args = parse_bench_args(parser, argv)
    work = work_dir_with_ray(None, "lean_rl_bench_curves_")
    curves: dict = {}
    points = work / "curves.json"  # after each curve, so that a run stopped halfway keeps what it measured

    def done(update: dict) -> None:
        curves.update(update)
        points.write_text(json.dumps(curves))
        plot_curves(curves, Path(args.png))

    if args.sizes:
        done(sync_curves(args, work))
    if args.convert_sizes:
        done({"convert": convert_curve(args, work)})
    if args.concurrency:
        done({"rollout": rollout_curve(args, work)})
    if args.nodes:
        import ray

        ray.shutdown()  # the node runs start clusters of their own
        done({"nodes": nodes_curve(args, work)})
    print(f"points: {points}")
    print(f"\ncurves: {args.png}")
    rows = rows_of(curves, args, command_line("curves", argv))
    for r in rows:
        print(f"- {r['what']}\n    ours:  {r['figure']}\n    floor: {r['floor']}")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("curves", main)
