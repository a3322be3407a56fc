"""Asynchronous RL training: generation overlaps training.

    python -m lean_rl.train_async --async-mode one-step ...   # rollout k+1 generates while step k trains
    python -m lean_rl.train_async --async-mode full --max-staleness 2 ...   # generation never stops

one-step: rollout k+1 runs on the weights of version k while the trainer trains on rollout k; the
weights are synced once both are done (so an update never lands mid-rollout), and rollout k+1 is one
version old when trained on.
full: a continuous generator keeps groups in flight; the trainer takes a batch as soon as the buffer
has one; each weight update pauses the engines, syncs, and resumes, and samples interrupted by it keep
their tokens and per-token versions. Admission control keeps every sample within --max-staleness
versions of the policy that trains on it.
Both use the same Runtime (buffer, trainer, engines, weight sync, checkpoints, logging) as train.py.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from lean_rl.backends.megatron.rank_errors import MegatronGroupError
from lean_rl.cli import run_command
from lean_rl.config import Config, parse_config
from lean_rl.options import ConfigError
from lean_rl.rollout.base import RolloutOutput
from lean_rl.rollout.continuous import ContinuousGenerator
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.debug_rollout import record_train_groups
from lean_rl.run_loop import run
from lean_rl.runtime import Runtime
from lean_rl.step_metrics import probe_metrics, staleness_metrics, step_metrics
from lean_rl.utils.metrics import setup_logging

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.health import EngineMonitor


def _trainer_and_monitor(rt: Runtime) -> tuple[MegatronGroup, EngineMonitor]:
    """The async modes train while the engines generate: they need both (main refuses --debug-*). Asked
    again at every step: a trainer heal replaces the group."""
    if rt.trainer is None or rt.monitor is None:
        raise RuntimeError("an async mode started without a trainer or without engines")
    return rt.trainer, rt.monitor


async def train_one_step_off(rt: Runtime) -> None:
    _trainer_and_monitor(rt)  # both started, or an error now
    step = rt.start_step
    ahead = RolloutAhead(rt)
    ahead.start(step)
    while step < rt.cfg.run.num_rollout:
        try:
            await one_step_off_step(rt, step, ahead)
            step += 1
        except MegatronGroupError as lost:  # a trainer rank, its node or a collective lost
            await ahead.settle()  # what it generated lands before the heal's rewind drops it
            step = await asyncio.to_thread(rt.heal_trainer, lost, step)  # back to the last checkpoint
            ahead.start(step)


async def one_step_off_step(rt: Runtime, step: int, ahead: RolloutAhead) -> None:
    from lean_rl.backends.megatron.train_driver import train_rollout  # deferred: --help loads no torch

    step_started = time.perf_counter()

    # 1. the rollout that generated while the previous step trained (on weights one version old)
    with rt.timers("wait_for_data"):
        done = await ahead.take()
    if done is None:  # SIGTERM / SIGINT came: nothing of this step is trained
        rt.stop.check(step)
    rollout, _ = done
    groups = rt.take_train_groups(step)

    # 2. start the next rollout on the current weights, and train meanwhile
    if step + 1 < rt.cfg.run.num_rollout:
        ahead.start(step + 1)
    with rt.timers("train"):
        train_metrics = await asyncio.to_thread(train_rollout, _trainer_and_monitor(rt)[0], groups, step,
                                                rt.train_options)

    # 3. let that rollout finish, then sync (an update never lands mid-rollout)
    generate_s = 0.0
    if ahead.task is not None:
        with rt.timers("wait_for_data"):  # after a signal: cancelled, its groups saved as pending
            done = await rt.stop.unless_stopped(ahead.task)
        generate_s = done[1] if done is not None else 0.0
    with rt.timers("sync"):
        report = await asyncio.to_thread(rt.sync_weights, step + 1)
    train_metrics.update(staleness_metrics(groups, step))
    train_metrics.update(probe_metrics(report.probe))

    # 4. checkpoint, evaluate, log
    await rt.maybe_save(step + 1)
    eval_metrics = await rt.maybe_evaluate(step + 1)
    rt.log(step, step_metrics(time.perf_counter() - step_started, rt.timers.pop(), rollout, train_metrics,
                              eval_metrics, generate_active_s=generate_s))
    rt.stop.check(step + 1)


class RolloutAhead:
    """The one rollout generating ahead of the trainer (one-step off-policy): at most one in flight."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.task: asyncio.Task[tuple[RolloutOutput, float]] | None = None

    def start(self, step: int) -> None:
        self.task = asyncio.create_task(self._timed(step))

    async def take(self) -> tuple[RolloutOutput, float] | None:
        """Its (output, seconds), or None when a signal came first; none is in flight afterwards."""
        task, self.task = self.task, None
        if task is None:
            raise RuntimeError("RolloutAhead.take: no rollout was started")
        return await self.rt.stop.unless_stopped(task)

    async def settle(self) -> None:
        """The task ended, whatever its outcome (its error is the lost trainer's consequence, not news)."""
        if self.task is not None:
            await asyncio.wait([self.task])
            if not self.task.cancelled() and self.task.exception() is not None:
                logger.warning("the rollout beside the lost trainer step ended with %r (dropped by the heal)",
                               self.task.exception())

    async def _timed(self, step: int) -> tuple[RolloutOutput, float]:
        started = time.perf_counter()
        out = await self.rt.rollout(step)
        return out, time.perf_counter() - started


async def train_fully_async(rt: Runtime) -> None:
    step = rt.start_step
    generator = _generator(rt, step)
    try:
        while step < rt.cfg.run.num_rollout:
            try:
                await fully_async_step(rt, step, generator)
                step += 1
            except MegatronGroupError as lost:  # a trainer rank, its node or a collective lost
                await generator.stop()  # nothing generates while the buffer goes back (engines unpaused)
                step = await asyncio.to_thread(rt.heal_trainer, lost, step)  # back to the last checkpoint
                generator = _generator(rt, step)
    finally:
        await generator.stop()


def _generator(rt: Runtime, version: int) -> ContinuousGenerator:
    _trainer_and_monitor(rt)  # both started, or an error now
    generator = ContinuousGenerator(rt.cfg, rt.buffer, rt.extensions, start_version=version,
                                    pause_mode=rt.cfg.run.pause_mode)
    generator.start()
    return generator


async def fully_async_step(rt: Runtime, step: int, generator: ContinuousGenerator) -> None:
    from lean_rl.backends.megatron.train_driver import train_rollout  # deferred: --help loads no torch

    trainer, monitor = _trainer_and_monitor(rt)
    step_started = time.perf_counter()
    idle_before = generator.idle_s

    # 1. wait until the buffer holds a batch that is fresh enough for policy version `step`
    with rt.timers("wait_for_data"):
        batch = await rt.stop.unless_stopped(generator.next_batch(step))
    if batch is None:  # SIGTERM / SIGINT came: nothing of this step is trained
        rt.stop.check(step)
    groups, counters = batch
    record_train_groups(rt.cfg.run, step, groups)  # --save-debug-rollout-data, --dump-samples-interval

    # 2. train while generation goes on
    with rt.timers("train"):
        train_metrics = await asyncio.to_thread(train_rollout, trainer, groups, step, rt.train_options)

    # 3. pause the engines, sync weights (version step + 1), resume
    with rt.timers("sync"), monitor.hold_health_checks():
        await generator.pause()
        # the probe generates, so it cannot run on paused engines: it follows the resume
        await asyncio.to_thread(rt.sync_weights, step + 1, False)
        await generator.resume(step + 1)
        probe = await asyncio.to_thread(rt.probe_weights, step + 1)
    train_metrics.update(staleness_metrics(groups, step))
    train_metrics.update(probe_metrics(probe))

    # 4. checkpoint, evaluate, log
    await rt.maybe_save(step + 1)
    eval_metrics = await rt.maybe_evaluate(step + 1)
    timers = rt.timers.pop()
    step_s = time.perf_counter() - step_started
    rollout = RolloutOutput(metrics=rollout_metrics(groups, step_s, counters))
    engine_busy = step_s - (generator.idle_s - idle_before) - timers.get("time/sync", 0.0)
    rt.log(step, step_metrics(step_s, timers, rollout, train_metrics, eval_metrics,
                              generate_active_s=max(engine_busy, 0.0)))
    rt.stop.check(step + 1)


def async_loop(cfg: Config) -> Callable[[Runtime], Awaitable[None]]:
    """The loop of cfg's --async-mode (also lean_rl/api.py's)."""
    if cfg.run.async_mode == "off":
        raise ConfigError("--async-mode off: run python -m lean_rl.train (or pass --async-mode one-step|full)")
    if cfg.run.debug_rollout_only or cfg.run.debug_train_only:
        raise ConfigError("--debug-rollout-only / --debug-train-only run one side alone: use python -m lean_rl.train "
                          "(the async modes overlap generation and training)")
    return train_fully_async if cfg.run.async_mode == "full" else train_one_step_off


def main(argv: list[str]) -> None:
    setup_logging()
    cfg = parse_config(argv)
    run(cfg, async_loop(cfg))


if __name__ == "__main__":  # the guard matters: checkpointing spawns processes that re-import __main__
    sys.exit(run_command("lean_rl", main, sys.argv[1:]))  # a user error: one line, exit 2 (lean_rl/cli.py)
