"""Flags of a training run as a whole: how many rollouts, the mode (colocated / one-step / fully
async), where outputs go, logging, debug modes, Ray."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

ASYNC_MODES = ("off", "one-step", "full")


@dataclass(frozen=True)
class RunConfig:
    num_rollout: int
    colocate: bool
    async_mode: str  # "off" (train.py) | "one-step" | "full" (train_async.py)
    output_dir: str  # metrics.jsonl, tensorboard/, samples/, engine logs
    ray_address: str | None
    tensorboard: bool
    use_wandb: bool
    wandb_project: str | None
    wandb_run_name: str | None
    dump_samples_interval: int | None
    debug_rollout_only: bool
    debug_train_only: bool
    save_debug_rollout_data: str | None  # a path with {rollout_id}
    load_debug_rollout_data: str | None  # a path with {rollout_id}
    pause_mode: str  # how full async pauses the engines for a weight update


def add_run_args(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--num-rollout", type=int, default=10, help="rollout + train steps of the run")
    run.add_argument("--colocate", action="store_true",
                     help="train and generate take turns on the same devices (engines release memory on GPU)")
    run.add_argument("--async-mode", default="off", choices=ASYNC_MODES,
                     help="off: generate then train; one-step: rollout k+1 overlaps training on k; "
                          "full: generation never stops (bounded by --max-staleness)")
    run.add_argument("--output-dir", default="outputs/lean_rl", help="metrics, tensorboard, samples, engine logs")
    run.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting a local one")
    run.add_argument("--no-tensorboard", action="store_true")
    run.add_argument("--use-wandb", action="store_true")
    run.add_argument("--wandb-project", default="lean_rl")
    run.add_argument("--wandb-run-name", default=None)
    run.add_argument("--dump-samples-interval", type=int, default=None, help="dump every sample every N rollouts")
    run.add_argument("--debug-rollout-only", action="store_true", help="generate and score only; no trainer")
    run.add_argument("--debug-train-only", action="store_true",
                     help="train only, on --load-debug-rollout-data; no engines")
    run.add_argument("--save-debug-rollout-data", default=None, metavar="PATH",
                     help="save each rollout's groups to PATH (use {rollout_id} in it)")
    run.add_argument("--load-debug-rollout-data", default=None, metavar="PATH",
                     help="train on rollouts saved by --save-debug-rollout-data instead of generating")
    run.add_argument("--pause-generation-mode", default="retract", choices=("abort", "retract", "in_place"),
                     help="full async: how engines pause for a weight update. retract (default): running "
                          "requests go back to the engine's queue and continue on the new weights, SGLang "
                          "reporting which tokens each version made; abort: they return with their tokens "
                          "and resume as partial rollouts (SGLang's abort pause waits ~1 s for them); "
                          "in_place: they keep their KV cache from the old weights")


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    def fail(message: str):
        raise ValueError(message)

    if args.num_rollout <= 0:
        fail(f"--num-rollout must be > 0, got {args.num_rollout}")
    if args.colocate and args.async_mode != "off":
        fail(f"--colocate cannot be combined with --async-mode {args.async_mode}: colocated engines and "
             "trainer take turns on the same devices, so nothing can overlap")
    if args.async_mode == "full" and args.max_staleness is None:
        fail("--async-mode full needs --max-staleness (how many policy versions old a sample may be)")
    if args.async_mode == "one-step" and args.max_staleness is not None and args.max_staleness < 1:
        fail("--async-mode one-step trains on samples one version old: --max-staleness must be >= 1")
    if args.debug_rollout_only and args.debug_train_only:
        fail("--debug-rollout-only and --debug-train-only exclude each other")
    if args.debug_train_only and not args.load_debug_rollout_data:
        fail("--debug-train-only needs --load-debug-rollout-data (there are no engines to generate with)")
    for flag in ("save_debug_rollout_data", "load_debug_rollout_data"):
        value = getattr(args, flag)
        if value and "{rollout_id}" not in value:
            fail(f"--{flag.replace('_', '-')} {value!r} must contain {{rollout_id}}")
    if args.use_wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            fail("--use-wandb needs the wandb package: .venv/bin/pip install wandb (it is not in the lock)")
    if args.dump_samples_interval is not None and args.dump_samples_interval <= 0:
        fail(f"--dump-samples-interval must be > 0, got {args.dump_samples_interval}")
    return RunConfig(
        num_rollout=args.num_rollout,
        colocate=args.colocate,
        async_mode=args.async_mode,
        output_dir=args.output_dir,
        ray_address=args.ray_address,
        tensorboard=not args.no_tensorboard,
        use_wandb=args.use_wandb,
        wandb_project=args.wandb_project,
        wandb_run_name=args.wandb_run_name,
        dump_samples_interval=args.dump_samples_interval,
        debug_rollout_only=args.debug_rollout_only,
        debug_train_only=args.debug_train_only,
        save_debug_rollout_data=args.save_debug_rollout_data,
        load_debug_rollout_data=args.load_debug_rollout_data,
        pause_mode=args.pause_generation_mode,
    )
