"""Running blocking user code from asyncio on threads that cannot keep the process alive.

asyncio.to_thread uses the event loop's default executor: a few threads (min(32, cores + 4)) that the
training loops also need for a train step, a weight sync and a checkpoint save, and that are joined
when the loop and the interpreter shut down. A user function that hangs there (an environment step
waiting on a dead service, an agent stuck in a blocking client) would take one of those threads for
good and hold the process at exit. User code therefore runs on daemon threads of its own:
run_in_daemon_thread (one new thread per call: the rollout function itself) or a DaemonThreadPool
(bounded: environment calls and blocking agent code, many at once).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable


def run_in_daemon_thread(fn: Callable[..., Any], *args) -> asyncio.Future:
    """`fn(*args)` on a new daemon thread, as an awaitable. Unlike asyncio.to_thread, whose executor
    threads are joined when the event loop and the interpreter shut down, a call that never returns
    (a hung user function, given up on by a deadline) does not block the exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    threading.Thread(target=_settle_with, args=(loop, future, fn, args),
                     name=f"lean_rl-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


class DaemonThreadPool:
    """At most `size` blocking calls at once, on daemon threads started as needed and kept for reuse.
    Calls beyond that wait their turn. A call that hangs holds its thread until it returns (a thread
    cannot be stopped from outside), never the process at exit; whoever awaits it gives up by its own
    deadline (asyncio.wait_for), and the pool keeps serving with the threads left."""

    def __init__(self, size: int, name: str):
        if size < 1:
            raise ValueError(f"DaemonThreadPool({name!r}): size must be >= 1, got {size}")
        self.size, self.name = size, name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._waiting = 0  # threads blocked on the queue, ready for a call
        self._queued = 0  # calls put and not yet taken

    @property
    def threads(self) -> int:
        return self._threads

    def run(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """`fn(*args)` on one of the pool's threads, as an awaitable of this event loop. Cancelling it
        (a deadline) abandons the call: its result is dropped when it comes."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._queued += 1
            start = self._queued > self._waiting and self._threads < self.size
            if start:
                self._threads += 1
        self._calls.put((loop, future, fn, args))
        if start:
            threading.Thread(target=self._serve, name=f"lean_rl-{self.name}-{self._threads}", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            loop, future, fn, args = self._calls.get()
            with self._lock:
                self._waiting -= 1
                self._queued -= 1
            if future.cancelled():  # given up on before it started: not run at all
                continue
            _settle_with(loop, future, fn, args)


def _settle_with(loop: asyncio.AbstractEventLoop, future: asyncio.Future, fn: Callable[..., Any], args) -> None:
    """Run `fn(*args)` here (a worker thread) and hand its result or error to `future` on `loop`."""
    try:
        result, error = fn(*args), None
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        result, error = None, exc
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop closed meanwhile (the run ended): nobody waits for this any more
        pass


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():  # cancelled by a deadline meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
