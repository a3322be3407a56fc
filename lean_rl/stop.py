"""Stopping a run on SIGTERM or SIGINT (a preemption, Ctrl-C) without losing what was done.

The first signal asks the loop to stop: generation that is running is cancelled (its groups go back to
the buffer as pending, see DataBuffer.state_dict), a train step or a weight sync that is running
finishes (neither can be cut without leaving the trainer or an engine half-updated), and the loop
raises RunStopped at the next step boundary with the step a checkpoint there holds; the training
script saves it when --save is set (a preemption save), closes everything (engines, router, trainer,
temp dirs) and exits with 128 + the signal number. If that takes longer than --stop-timeout, or a
second signal comes, the process exits at once: Ray ends the actors it owned, the engines' servers
and the router die with their parents (PDEATHSIG), and a rerun resumes from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from typing import Awaitable, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunStopped(Exception):
    """The run stopped on a signal at a step boundary: `step` rollouts are trained."""

    def __init__(self, step: int, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} with {step} rollouts trained")
        self.step, self.signum = step, signum


class StopSignals:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.signum: int | None = None
        self._event: asyncio.Event | None = None

    def install(self) -> None:
        """Handle SIGTERM / SIGINT in the running event loop (call from inside it)."""
        loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        for signum in SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)

    def check(self, step: int) -> None:
        """At a step boundary (`step` rollouts trained): raise RunStopped if a signal came."""
        if self.signum is not None:
            raise RunStopped(step, self.signum)

    async def unless_stopped(self, awaitable: Awaitable[T]) -> T | None:
        """`awaitable`'s result, or None when a signal comes first (it is then cancelled)."""
        task = asyncio.ensure_future(awaitable)
        if self._event is None:
            return await task
        stop = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return None

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            logger.error("%s again: exiting now (the last checkpoint is where a rerun resumes)", name)
            os._exit(128 + signum)
        self.signum = signum
        if self._event is not None:
            self._event.set()
        logger.warning("%s: stopping at the next step boundary (running generation is cancelled, a running "
                       "train step or weight sync finishes), then saving a checkpoint if --save is set; "
                       "exiting within --stop-timeout %.0f s (a second signal exits at once)", name, self.timeout_s)
        watchdog = threading.Timer(self.timeout_s, self._give_up, args=(signum,))
        watchdog.daemon = True
        watchdog.start()

    def _give_up(self, signum: int) -> None:
        logger.error("not stopped within --stop-timeout %.0f s: exiting now (the last checkpoint is where a "
                     "rerun resumes)", self.timeout_s)
        os._exit(128 + signum)
