"""Blocking environment and agent code, run off the event loop on a bounded pool of daemon threads.

    from lean_rl.rollout.blocking import run_blocking
    answer = await run_blocking(cfg, my_blocking_agent, client, prompt)   # e.g. an openai.OpenAI agent

The pool is the run's own (--rollout-blocking-threads threads), not asyncio's default executor: the
training loop needs that one for its train steps, weight syncs and checkpoint saves, and joins its
threads at exit. So environment calls or agents that hang never delay a step or a sync, and never hold
the process when the run ends (lean_rl/utils/threads.py DaemonThreadPool). Bound each call with a
deadline of your own (asyncio.wait_for): a hung call is given up on, its thread stays with it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Callable

from lean_rl.utils.threads import DaemonThreadPool

if TYPE_CHECKING:
    from lean_rl.config import Config

_pools: dict[int, DaemonThreadPool] = {}
_pools_lock = threading.Lock()


def blocking_pool(cfg: Config) -> DaemonThreadPool:
    """The process's pool for blocking user code, of --rollout-blocking-threads threads."""
    size = cfg.rollout.blocking_threads
    with _pools_lock:
        if size not in _pools:
            _pools[size] = DaemonThreadPool(size, "blocking")
        return _pools[size]


def run_blocking(cfg: Config, fn: Callable[..., Any], *args) -> asyncio.Future:
    """`fn(*args)` on the run's pool of threads for blocking user code, as an awaitable."""
    return blocking_pool(cfg).run(fn, *args)
