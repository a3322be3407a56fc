"""The same call on several engines at once (BlockingEngineClient.submit), with one deadline."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Callable, Sequence

from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.client_errors import EngineError
from lean_rl.weight_sync.errors import WeightSyncError

Calls = Sequence[tuple[str, Future]]  # (engine URL, the call's future)


def submit_all(clients: Sequence[BlockingEngineClient], fn: Callable, *args, **kwargs) -> list[tuple[str, Future]]:
    """`fn` (an EngineClient method, by reference) on every client; (URL, future) each."""
    return [(client.base_url, client.submit(fn, *args, **kwargs)) for client in clients]


def wait_all(calls: Calls, wait_s: float, what: str) -> list:
    """Results in order. Waits for every call, then raises the first failure, naming its engine (so
    no call is left running behind the error)."""
    deadline = time.monotonic() + wait_s
    results, errors = [], []
    for url, future in calls:
        try:
            results.append(future.result(timeout=max(deadline - time.monotonic(), 0.0)))
        except TimeoutError as exc:
            errors.append(WeightSyncError(f"{what}: {url} did not answer within {wait_s:.0f}s"))
            errors[-1].__cause__ = exc
        except EngineError as exc:  # its message starts with the URL and endpoint
            errors.append(WeightSyncError(f"{what}: {exc}"))
            errors[-1].__cause__ = exc
        except Exception as exc:
            errors.append(WeightSyncError(f"{what}: {url}: {type(exc).__name__}: {exc}"))
            errors[-1].__cause__ = exc
    if errors:
        raise errors[0]
    return results


def call_all(clients: Sequence[BlockingEngineClient], wait_s: float, fn: Callable, *args, **kwargs) -> list:
    """`fn` (an EngineClient method) on every client at once; `kwargs` go to it (e.g. its own timeout_s)."""
    return wait_all(submit_all(clients, fn, *args, **kwargs), wait_s, fn.__name__)
