"""Flags of a training run as a whole: how many rollouts, the mode (colocated / one-step / fully
async), where outputs go, logging, debug modes, Ray. Checks that need other parts of the config
(--max-staleness, --load-debug-rollout-data with --prompt-data) are in config.parse_config."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from lean_rl.options import ConfigError, option

ASYNC_MODES = ("off", "one-step", "full")


@dataclass(frozen=True)
class RunConfig:
    num_rollout: int = option(10, positive=True, help="rollout + train steps of the run")
    colocate: bool = option(False, help="train and generate take turns on the same devices (engines release "
                                        "memory on GPU)")
    async_mode: str = option("off", choices=ASYNC_MODES,  # "off" (train.py) | "one-step" | "full" (train_async.py)
                             help="off: generate then train; one-step: rollout k+1 overlaps training on k; "
                                  "full: generation never stops (bounded by --max-staleness)")
    output_dir: str = option("outputs/lean_rl", help="metrics, tensorboard, samples, engine logs")
    stop_timeout_s: float = option(  # lean_rl/stop.py
        120.0, flag="--stop-timeout", positive=True,
        help="seconds from SIGTERM / SIGINT to exit: the running train step and sync finish, a checkpoint is "
             "saved (with --save); past this the process exits at once")
    ray_address: str | None = option(None, help="join this Ray cluster instead of starting a local one")
    tensorboard: bool = option(True, flag="--no-tensorboard")
    use_wandb: bool = option(False)
    wandb_project: str | None = option("lean_rl")
    wandb_run_name: str | None = option(None)
    dump_samples_interval: int | None = option(None, positive=True, help="dump every sample every N rollouts")
    debug_rollout_only: bool = option(False, help="generate and score only; no trainer")
    debug_train_only: bool = option(False, help="train only, on --load-debug-rollout-data; no engines")
    save_debug_rollout_data: str | None = option(  # a path with {rollout_id}
        None, metavar="PATH", help="save each rollout's groups to PATH (use {rollout_id} in it)")
    load_debug_rollout_data: str | None = option(  # a path with {rollout_id}
        None, metavar="PATH", help="train on rollouts saved by --save-debug-rollout-data instead of generating")
    ci_test: bool = option(False, help=(
        "checks for the CI of a recipe (lean_rl/ci_test.py): at step 0 the trainer's log-probs of the rollout "
        "equal the engine's within --ci-test-max-mismatch and the reference's within 1e-6 (float32); every "
        "synchronous step keeps the mismatch under the bound; a failed check stops the run"))
    ci_test_max_mismatch: float = option(0.02, positive=True, help=(
        "--ci-test bound on the mean |trainer - engine| log-prob of trained tokens and on KL(rollout || train)"))
    pause_mode: str = option(  # how full async pauses the engines for a weight update
        "retract", flag="--pause-generation-mode", choices=("abort", "retract", "in_place"),
        help="full async: how engines pause for a weight update. retract (default): running requests go back to "
             "the engine's queue and continue on the new weights, SGLang reporting which tokens each version "
             "made; abort: they return with their tokens and resume as partial rollouts (SGLang's abort pause "
             "waits ~1 s for them); in_place: they keep their KV cache from the old weights")

    def __post_init__(self) -> None:
        if self.colocate and self.async_mode != "off":
            raise ConfigError(f"--colocate cannot be combined with --async-mode {self.async_mode}: colocated "
                              "engines and trainer take turns on the same devices, so nothing can overlap")
        if self.debug_rollout_only and self.debug_train_only:
            raise ConfigError("--debug-rollout-only and --debug-train-only exclude each other")
        if self.debug_train_only and not self.load_debug_rollout_data:
            raise ConfigError("--debug-train-only needs --load-debug-rollout-data (there are no engines to "
                              "generate with)")
        for flag, value in (("--save-debug-rollout-data", self.save_debug_rollout_data),
                            ("--load-debug-rollout-data", self.load_debug_rollout_data)):
            if value and "{rollout_id}" not in value:
                raise ConfigError(f"{flag} {value!r} must contain {{rollout_id}}")
        if self.use_wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError("--use-wandb needs the wandb package: .venv/bin/pip install wandb (it is not in the lock)")
