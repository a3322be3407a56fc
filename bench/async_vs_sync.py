"""Sync vs one-step vs fully async training on the same long-tailed workload, in one run.

    .venv/bin/python bench/async_vs_sync.py [--steps 12] [--preset tiny] [--max-response-len 256]

Each mode runs the real command (python -m lean_rl.train / train_async) on the toy task with response
lengths drawn from a Pareto tail per sample (lean_rl.testing.toy_task.long_tail_generate, identical
across modes). Reported per mode, over the steps after the first: wall time, the fraction of it each
side sat idle (trainer: not training; engines: not generating), and the framework overhead (step time
outside generate / wait / train / sync / save / eval). Speedups are sync wall time / mode wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_common import at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from goals import parse_goal
from lean_rl.testing.tiny_model import PRESETS, make_tiny_model
from lean_rl.testing.toy_task import write_dataset

REPO = Path(__file__).resolve().parents[1]
QUICK = {"steps": 5, "max_response_len": 128}
WIDE = "; 24 prompt groups in flight: all that --max-staleness 2 admits, --over-sampling-batch-size 24"
SPEEDUP_GOAL = ">= 1"
WIDE_GOAL = ">= 2.77 (AReaL's, where generation dominates)"  # async must not be slower than sync on the same workload
OVERHEAD_GOAL = 0.05  # of step time
MODES = {
    "sync": ("lean_rl.train", []),
    "one-step": ("lean_rl.train_async", ["--async-mode", "one-step"]),
    "full": ("lean_rl.train_async", ["--async-mode", "full", "--max-staleness", "2"]),
    # the same bound, with as many prompt groups in flight as it admits ((max_staleness + 1) x 8): with 8, the
    # engine's batch thins out while the tail of each group finishes (continuous.py: max_in_flight)
    "full-wide": ("lean_rl.train_async", ["--async-mode", "full", "--max-staleness", "2",
                                          "--over-sampling-batch-size", "24"]),
}


def run_mode(name: str, work: Path, model: Path, data: Path, args) -> list[dict]:
    module, extra = MODES[name]
    out = work / name
    flags = ["--hf-checkpoint", str(model), "--output-dir", str(out), "--no-tensorboard",
             "--prompt-data", str(data), "--rollout-shuffle", "--num-rollout", str(args.steps),
             "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
             "--custom-generate-function-path", "lean_rl.testing.toy_task.long_tail_generate",
             "--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
             "--rollout-max-response-len", str(args.max_response_len), "--lr", "1e-4",
             "--micro-batch-size", "16", "--rollout-num-engines", "1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=args.timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed (last lines of its stderr):\n{result.stderr[-4000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]


def summarize(rows: list[dict]) -> dict[str, float]:
    rows = rows[1:]  # the first step pays one-time costs (first compile, first sync)
    wall = sum(r["time/step"] for r in rows)
    return {
        "wall_s": wall,
        "trainer_idle": sum(r["time/trainer_idle"] for r in rows) / wall,
        "engine_idle": sum(r["time/engine_idle"] for r in rows) / wall,
        "overhead": sum(r["perf/overhead_frac"] * r["time/step"] for r in rows) / wall,
        "train_s": sum(r.get("time/train", 0.0) for r in rows),
        "tokens": sum(r.get("rollout/response_tokens", 0.0) for r in rows),
        # tokens per second while any request was in flight: how fast the engine generates when the
        # schedule keeps it fed (the long tail of a sync step runs it at a batch of one)
        "busy_tok_s": sum(r.get("rollout/response_tokens", 0.0) for r in rows)
        / max(sum(r["time/step"] - r["time/engine_idle"] for r in rows), 1e-9),
        # every step ends with a weight sync, and the engine generates nothing while it loads the weights
        "syncs": len(rows),
        "shortest_sync_s": min((r["time/sync"] for r in rows if "time/sync" in r), default=0.0),
    }


def engine_bound(results: dict[str, dict[str, float]]) -> tuple[str, float, float]:
    """(the mode whose engine generated fastest while busy, the wall time sync's tokens would take at
    that rate with the trainer wholly overlapped and the engine paused only for sync's weight syncs, each
    as short as the shortest any mode measured, that pause): the speedup over sync no schedule of this
    engine reaches without generating faster, or loading weights sooner, than it ever did in this run."""
    best = max(results, key=lambda name: results[name]["busy_tok_s"])
    pause_s = results["sync"]["syncs"] * min(r["shortest_sync_s"] for r in results.values())
    return best, results["sync"]["tokens"] / results[best]["busy_tok_s"] + pause_s, pause_s


def main(argv: list[str]) -> int:
    parser = bench_parser("async_vs_sync", __doc__, QUICK)
    parser.add_argument("--steps", type=at_least(2), default=12, help="steps per mode (the first is excluded)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="tiny-model preset")
    parser.add_argument("--max-response-len", type=at_least(1), default=256)
    parser.add_argument("--timeout", type=at_least(1), default=1800, help="seconds per mode's run")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                        help="which modes besides sync (always run: the speedups are over it)")
    args = parse_bench_args(parser, argv)
    work = Path(tempfile.mkdtemp(prefix="lean_rl_bench_async_"))
    model = make_tiny_model(work / "model", preset=args.preset)
    data = write_dataset(work / "train.jsonl", 512, seed=0)
    results = {name: summarize(run_mode(name, work, model, data, args)) for name in MODES
               if name == "sync" or name in args.modes}
    base = results["sync"]["wall_s"]
    print(f"\n{args.steps - 1} steps each (first excluded), {args.preset} model, Pareto response lengths <= "
          f"{args.max_response_len} tokens, 8 prompts x 8 samples per step")
    print(f"{'mode':20s} {'wall s':>8s} {'speedup':>8s} {'trainer idle':>13s} {'engine idle':>12s} "
          f"{'overhead':>9s} {'train s':>8s} {'tokens':>8s} {'busy tok/s':>11s}")
    for name, r in results.items():
        print(f"{name:20s} {r['wall_s']:8.1f} {base / r['wall_s']:7.2f}x {r['trainer_idle']:12.1%} "
              f"{r['engine_idle']:11.1%} {r['overhead']:8.2%} {r['train_s']:8.1f} {r['tokens']:8.0f} "
              f"{r['busy_tok_s']:11.0f}")
    fastest, bound_s, pause_s = engine_bound(results)
    syncs = results["sync"]["syncs"]
    print(f"engine bound: sync's {results['sync']['tokens']:.0f} tokens at {fastest}'s busy rate + {syncs} weight "
          f"syncs' pause ({pause_s:.2f} s) = {bound_s:.1f} s, at most {base / bound_s:.2f}x over sync")
    workload = (f"{args.preset}, Pareto response lengths <= {args.max_response_len}, 8 prompts × 8 samples, "
                f"{args.steps - 1} steps")
    command = command_line("async_vs_sync", argv)
    sync = results["sync"]
    wide_target = parse_goal(WIDE_GOAL)[1]
    # no schedule of generation and training finishes before the engine has made sync's tokens at its best rate
    bound_why = (f"the engine bound measured in this run allows at most {base / bound_s:.2f}x over sync on this "
                 f"engine (row 'fastest async mode / the engine bound': generating at its best rate, paused only to "
                 f"load weights); where generation dominates (GPU engines, long rollouts, syncs short beside "
                 f"them) the bound rises" if base / bound_s < wide_target else None)
    rows = [row(f"{name} async / sync wall time ({workload}{WIDE if name == 'full-wide' else ''}); trainer idle, "
                "engine idle",
                f"{r['wall_s']:.1f} s; idle {r['trainer_idle']:.0%}, {r['engine_idle']:.0%}",
                f"{sync['wall_s']:.1f} s sync; idle {sync['trainer_idle']:.0%}, {sync['engine_idle']:.0%}",
                base / r["wall_s"], WIDE_GOAL if name == "full-wide" else SPEEDUP_GOAL, command,
                why=bound_why if name == "full-wide" else None)
            for name, r in results.items() if name != "sync"]
    best_async = min((name for name in results if name != "sync"), key=lambda name: results[name]["wall_s"])
    rows.append(row(f"fastest async mode ({best_async}) / the engine bound: sync's response tokens at the best "
                    f"rate the engine generated at while busy in any mode ({fastest}'s), the trainer wholly "
                    f"overlapped, the engine paused only to load each step's weights ({workload})",
                    f"{results[best_async]['wall_s']:.1f} s ({base / results[best_async]['wall_s']:.2f}x sync)",
                    f"{bound_s:.1f} s: {bound_s - pause_s:.1f} s at {results[fastest]['busy_tok_s']:.0f} tok/s + "
                    f"{syncs} weight syncs x {pause_s / max(syncs, 1):.3f} s (the shortest measured): at most "
                    f"{base / bound_s:.2f}x over sync on this engine", results[best_async]["wall_s"] / bound_s, "—",
                    command))
    worst = max(results, key=lambda name: results[name]["overhead"])
    rows.append(row(f"framework overhead: step time outside generate / wait / train / sync / save / eval, worst "
                    f"mode ({workload})", ", ".join(f"{name} {r['overhead']:.2%}" for name, r in results.items()),
                    "—", results[worst]["overhead"], f"< {OVERHEAD_GOAL}", command))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("async_vs_sync", main)
