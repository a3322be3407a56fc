"""Trainer step time per layout: train_driver.train_on_rollout() as the driver sees it vs the floor, the
rank's own Megatron forward/backward/optimizer step (timed inside the rank), same run, same batch.

    .venv/bin/python bench/train_step.py [--layouts tp1,dp2,dp2-distopt,tp2,pp2,ep2] [--steps 10]
                                         [--groups 4] [--group-size 4] [--preset tiny]

The difference is framework overhead: turning sample groups into micro-batches, advantages, shipping
them to the ranks through Ray, and collecting metrics. Also prints each layout's loss curve (the PPO
surrogate against fixed old log-probs on one batch, which falls as the policy moves)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.backends.megatron.train_config import BatchConfig, CheckpointConfig, OptimizerConfig, TrainConfig
from lean_rl.testing.sample_groups import make_groups, set_rollout_log_probs
from lean_rl.testing.tiny_model import PRESETS, make_tiny_model
from lean_rl.utils.ray_utils import init_ray
from lean_rl.options import build

LAYOUTS = {  # name: (arch, parallel config, world size, distributed optimizer)
    "tp1": ("qwen2", ParallelConfig(), 1, False),
    "dp2": ("qwen2", ParallelConfig(), 2, False),
    "dp2-distopt": ("qwen2", ParallelConfig(), 2, True),
    "tp2": ("qwen2", ParallelConfig(tensor_model_parallel_size=2), 2, False),
    "tp2-sp": ("qwen2", ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True), 2, False),
    "pp2": ("qwen2", ParallelConfig(pipeline_model_parallel_size=2), 2, False),
    "ep2": ("qwen3_moe", ParallelConfig(expert_model_parallel_size=2), 2, False),
}


def run_layout(name: str, models: Path, args) -> dict:
    arch, parallel, world, distopt = LAYOUTS[name]
    checkpoint = make_tiny_model(models / f"{arch}-{args.preset}", arch=arch, seed=0, preset=args.preset)
    train = TrainConfig(optimizer=OptimizerConfig(lr=1e-5, use_distributed_optimizer=distopt),
                        batch=BatchConfig(micro_batch_size=2), checkpoint=CheckpointConfig(hf_checkpoint=str(checkpoint)))
    # no KL term: no reference forward pass, so train_on_rollout() is one optimizer step plus framework work
    algo = build(AlgorithmConfig, use_rollout_logprobs=True)
    groups = make_groups(seed=1, num_groups=args.groups, group_size=args.group_size)
    with MegatronGroup.from_hf_checkpoint(checkpoint, parallel, world_size=world) as group:
        initialize_for_training(group, train, algo)
        set_rollout_log_probs(group, groups)
        driver, rank, losses = [], [], []
        for _ in range(args.steps):
            start = time.perf_counter()
            metrics = train_on_rollout(group, groups, policy_version=0)
            driver.append(time.perf_counter() - start)
            rank.append(metrics["train/step_time_s"])
            losses.append(metrics["train/pg_loss"])
    warm = slice(1, None)  # the first step builds optimizer state and warms caches
    return {"layout": name, "driver_ms": statistics.median(driver[warm]) * 1000,
            "rank_ms": statistics.median(rank[warm]) * 1000, "losses": losses}


QUICK = {"layouts": "tp1,pp2", "steps": 4}


def layout_list(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{','.join(unknown) or text!r}: choose from {','.join(LAYOUTS)}")
    return names


def main(argv: list[str]) -> int:
    parser = bench_parser("train_step", __doc__, QUICK)
    parser.add_argument("--layouts", type=layout_list, default="tp1,dp2,dp2-distopt,tp2,pp2,ep2")
    parser.add_argument("--steps", type=at_least(2), default=10, help="train() calls per layout (the first is excluded)")
    parser.add_argument("--groups", type=at_least(1), default=4)
    parser.add_argument("--group-size", type=at_least(1), default=4)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    args = parse_bench_args(parser, argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    init_ray(num_cpus=os.cpu_count())
    rows, table = [], []
    command = command_line("train_step", argv)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.layouts:
            table.append(run_layout(name, Path(tmp), args))
            result = table[-1]
            ratio = result["driver_ms"] / result["rank_ms"]
            print(f"{name:12s} train() {result['driver_ms']:7.1f} ms   rank step (floor) {result['rank_ms']:7.1f} ms   "
                  f"ratio {ratio:.2f}   pg_loss " + " ".join(f"{x:.4f}" for x in result["losses"]), flush=True)
            rows.append(row(f"`train()` as the driver sees it / the rank's own Megatron step, {name} "
                            f"({args.groups}×{args.group_size} samples, {args.preset}, median of {args.steps - 1})",
                            f"{result['driver_ms']:.0f} ms", f"{result['rank_ms']:.0f} ms rank step", ratio, NO_GOAL,
                            command))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("train_step", main)
