"""Stopping a run on SIGTERM or SIGINT (a preemption, Ctrl-C) without losing what was done.

The first signal asks the loop to stop: generation that is running is cancelled (its groups go back to
the buffer as pending, see DataBuffer.state_dict), a train step, a weight sync or a checkpoint save that
is running finishes (none can be cut without leaving the trainer, an engine or the checkpoint
half-written), and the loop raises RunStopped at the next step boundary with the step a checkpoint there
holds; the training script saves it when --save is set (a preemption save), closes everything (engines,
router, trainer, temp dirs) and exits with 128 + the signal number. If that takes longer than
--stop-timeout, or a second signal comes, the process exits at once: Ray ends the actors it owned, the
engines' servers and the router die with their parents (PDEATHSIG), and a rerun resumes from the last
checkpoint.

Signals are read by a thread of their own, not by the event loop: Python's C-level handler writes each
signal's number to a wakeup pipe (signal.set_wakeup_fd) in whatever thread the kernel interrupts, and
the watcher thread blocked on that pipe wakes at once. So a second signal and the --stop-timeout
watchdog work while the loop or the main thread is busy (a blocking call, a hung callback); the loop
is only told, thread-safely, to stop at its next boundary.
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


def _noted_by_the_watcher(signum, frame) -> None:
    """The main thread's Python-level handler: nothing to do (the watcher thread acts on the signal);
    it must exist so that Python's C handler runs and writes the wakeup pipe, and so that SIGINT does
    not raise KeyboardInterrupt in whatever the main thread is doing."""


class StopSignals:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.signum: int | None = None
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pipe: tuple[int, int] | None = None
        self._previous_handlers: dict[int, object] = {}
        self._previous_wakeup_fd = -1
        self.watchdog: threading.Timer | None = None

    def install(self) -> None:
        """Handle SIGTERM / SIGINT from now until uninstall() (call from inside the running event loop,
        on the main thread: Python sets signal handlers only there)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._pipe is not None or threading.current_thread() is not threading.main_thread():
            return  # off the main thread (lean_rl/api.py beside a notebook's loop): the caller relays (request_stop)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block on a full pipe
        self._pipe = (read_fd, write_fd)
        self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for signum in SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, _noted_by_the_watcher)
        threading.Thread(target=self._watch, args=(read_fd,), name="lean_rl-stop-signals", daemon=True).start()

    def uninstall(self) -> None:
        """Give the signals back to the handlers that were there before install() (main thread). An
        armed watchdog stays armed: the process still exits within --stop-timeout of the first signal."""
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        read_fd, write_fd = self._pipe
        self._pipe = None
        os.close(write_fd)  # the watcher reads end-of-file and ends; it closes read_fd

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

    def _watch(self, read_fd: int) -> None:
        try:
            while chunk := os.read(read_fd, 64):
                for signum in chunk:
                    if signum in SIGNALS:
                        self._on_signal(signum)
        finally:
            os.close(read_fd)

    def request_stop(self, signum: int) -> None:
        """As if `signum` had come (from any thread): a caller that receives the signals itself relays them."""
        self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        """On the watcher thread, or the thread of request_stop."""
        name = signal.Signals(signum).name
        if self.signum is not None:
            logger.error("%s again: exiting now (the last checkpoint is where a rerun resumes)", name)
            os._exit(128 + signum)
        self.signum = signum
        self.watchdog = threading.Timer(self.timeout_s, self._give_up, args=(signum,))
        self.watchdog.daemon = True
        self.watchdog.start()
        logger.warning("%s: stopping at the next step boundary (running generation is cancelled, a running "
                       "train step, weight sync or checkpoint save finishes), then saving a checkpoint if --save "
                       "is set; exiting within --stop-timeout %.0f s (a second signal exits at once)",
                       name, self.timeout_s)
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop already closed (the run is shutting down): nothing to wake
                pass

    def _give_up(self, signum: int) -> None:
        logger.error("not stopped within --stop-timeout %.0f s: exiting now (the last checkpoint is where a "
                     "rerun resumes)", self.timeout_s)
        os._exit(128 + signum)
