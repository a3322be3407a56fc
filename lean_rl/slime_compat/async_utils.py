"""slime.utils.async_utils: `run(coro)` runs a coroutine on one background event loop and waits for it
(slime's synchronous rollout functions call their async code this way)."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["get_async_loop", "run"]


class AsyncLoopThread:
    """An event loop on a daemon thread: a caller that never returns cannot keep the process alive."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slime-compat-async-loop", daemon=True)
        self._thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_loop: AsyncLoopThread | None = None
_lock = threading.Lock()


def get_async_loop() -> AsyncLoopThread:
    global _loop
    with _lock:
        if _loop is None:
            _loop = AsyncLoopThread()
    return _loop


def run(coro):
    """Run `coro` on the background loop and return its result (raise its exception)."""
    return get_async_loop().run(coro)
