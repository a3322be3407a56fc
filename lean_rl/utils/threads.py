"""Running blocking user code from asyncio on a thread that cannot keep the process alive."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable


def run_in_daemon_thread(fn: Callable[..., Any], *args) -> asyncio.Future:
    """`fn(*args)` on a new daemon thread, as an awaitable. Unlike asyncio.to_thread, whose executor
    threads are joined when the event loop and the interpreter shut down, a call that never returns
    (a hung user function, given up on by a deadline) does not block the exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result=None, error: BaseException | None = None) -> None:
        if future.done():  # cancelled by a deadline meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, error)
            return
        loop.call_soon_threadsafe(settle, result)

    threading.Thread(target=target, name=f"lean_rl-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future
