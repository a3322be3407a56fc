"""Synchronous RL training: generate -> train -> sync weights, one rollout at a time.

    python -m lean_rl.train --hf-checkpoint DIR --prompt-data FILE [Megatron / rollout / algorithm flags]

With --colocate the engines and the trainer take turns on the same devices (on GPU the engines
release their memory while the trainer trains, and the trainer offloads while they generate); without
it they live on separate devices and still take turns. For overlapped modes see train_async.py.
"""

from __future__ import annotations

import asyncio
import sys
import time

from lean_rl.backends.megatron.rank_errors import MegatronGroupError
from lean_rl.cli import run_command
from lean_rl.config import parse_config
from lean_rl.options import ConfigError
from lean_rl.run_loop import run
from lean_rl.runtime import Runtime
from lean_rl.step_metrics import probe_metrics, step_metrics
from lean_rl.utils.metrics import setup_logging


async def train(rt: Runtime) -> None:
    step = rt.start_step
    while step < rt.cfg.run.num_rollout:
        try:
            await train_step(rt, step)
            step += 1
        except MegatronGroupError as lost:  # a trainer rank, its node or a collective lost
            step = await asyncio.to_thread(rt.heal_trainer, lost, step)  # back to the last checkpoint


async def train_step(rt: Runtime, step: int) -> None:
    from lean_rl.backends.megatron.train_driver import train_rollout  # here, not above: --help loads no torch

    step_started = time.perf_counter()

    # 1. generate: the rollout function pulls prompts, generates, scores, and fills the buffer
    with rt.timers("generate"):  # --debug-train-only: replays the saved rollout
        rollout = await rt.stop.unless_stopped(rt.rollout(step))
    if rollout is None:  # SIGTERM / SIGINT came: nothing of this step is trained
        rt.stop.check(step)
    groups = rt.take_train_groups(step)

    train_metrics = {}
    with rt.turns.turn():  # colocated on GPU: engines released and trainer onloaded until the sync ends
        # 2. train on the groups (policy version `step` -> `step + 1`), checkpoint
        if rt.trainer is not None:
            with rt.timers("train"):
                train_metrics = await asyncio.to_thread(train_rollout, rt.trainer, groups, step, rt.train_options)
        await rt.maybe_save(step + 1)  # before the sync: colocated on GPU the trainer leaves the devices then

        # 3. sync: the engines serve version step + 1, proven by the probe (the trainer offloads first)
        if rt.weight_sync is not None:
            with rt.timers("sync"):
                report = await asyncio.to_thread(rt.sync_weights, step + 1)
            train_metrics.update(probe_metrics(report.probe), **{"sync/bytes": report.bytes})

    # 4. evaluate, log
    eval_metrics = await rt.maybe_evaluate(step + 1)
    timers = rt.timers.pop()
    rt.log(step, step_metrics(time.perf_counter() - step_started, timers, rollout,
                              train_metrics, eval_metrics, generate_active_s=timers.get("time/generate", 0.0)))
    rt.stop.check(step + 1)  # after a signal: stop here, this step saved (lean_rl/stop.py)


def main(argv: list[str]) -> None:
    setup_logging()
    cfg = parse_config(argv)
    if cfg.run.async_mode != "off":
        raise ConfigError(f"--async-mode {cfg.run.async_mode}: run python -m lean_rl.train_async")
    run(cfg, train)  # SIGTERM / SIGINT: saved at a step boundary, exit 128 + signal


if __name__ == "__main__":  # the guard matters: checkpointing spawns processes that re-import __main__
    sys.exit(run_command("lean_rl", main, sys.argv[1:]))  # a user error: one line, exit 2 (lean_rl/cli.py)
