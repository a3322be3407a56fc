"""What a training script's main does with its loop: start the Runtime, freeze the start-up heap
(utils/gc_heap.py: the rollouts' full collections skip it), run `loop(rt)` until done or a signal
(SIGTERM / SIGINT: lean_rl/stop.py; the loop stops at a step boundary and that step is saved with
--save), close everything, print the summary; after a signal, exit with 128 + its number."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable

from lean_rl.config import Config
from lean_rl.plot import write_run_curves
from lean_rl.runtime import Runtime
from lean_rl.stop import RunStopped
from lean_rl.utils.gc_heap import freeze_startup_heap
from lean_rl.utils.metrics import print_run_summary

logger = logging.getLogger(__name__)


def run(cfg: Config, loop: Callable[[Runtime], Awaitable[None]], runtime: type[Runtime] = Runtime) -> None:
    rt = runtime(cfg).start()
    freeze_startup_heap()
    stopped = None
    try:
        if not rt.finished:
            stopped = asyncio.run(run_until_stopped(rt, loop))
    finally:
        try:
            rt.close()  # still under the signal watcher: a second signal exits at once
        finally:
            rt.stop.uninstall()
    print_run_summary(cfg.run.output_dir)
    write_run_curves(cfg.run.output_dir)  # OUTPUT_DIR/curves.png; a failure is only a warning
    if stopped is not None:
        sys.exit(128 + stopped.signum)


async def run_until_stopped(rt: Runtime, loop: Callable[[Runtime], Awaitable[None]]) -> RunStopped | None:
    """`await loop(rt)` with the signals handled; returns the RunStopped, if any."""
    rt.stop.install()  # until run() has closed everything (stop.uninstall)
    try:
        await loop(rt)
    except RunStopped as stopped:
        logger.warning("%s", stopped)
        await rt.save(stopped.step)
        return stopped
    finally:
        for close in rt.closers:  # registered by rollout code for this loop (Runtime.closers): capture servers
            await close()
    return None
