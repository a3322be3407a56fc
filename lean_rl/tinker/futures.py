"""The futures of Tinker's protocol: every training or sampling call answers at once with a request id,
and the client long-polls /retrieve_future until the work is done.

Each future has a deadline: work still running past it resolves as a server error, so a client never
waits without end on a lost request. A request id the table does not know (never issued, or expired
after its result was kept `keep_s`) is an error too, never "still pending". Retried POSTs of one
training call (same model id and seq id) get the future of the first one (`dedupe_key`)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any


class UserError(Exception):
    """A request the server refuses (bad input, an unsupported call): category "user" to the client."""


@dataclass(frozen=True)
class Pending:
    pass


@dataclass(frozen=True)
class Done:
    value: Any  # bytes (protobuf) or a JSON-able dict


@dataclass(frozen=True)
class Failed:
    message: str
    category: str  # "user" | "server" (tinker.RequestErrorCategory values)

    def body(self) -> dict:
        return {"error": self.message, "category": self.category}


Outcome = Pending | Done | Failed


@dataclass
class _Entry:
    task: asyncio.Future
    deadline: float
    finished_at: float | None = None
    outcome: Outcome | None = None


class FutureTable:
    def __init__(self, deadline_s: float, keep_s: float = 3600.0):
        self.deadline_s, self.keep_s = deadline_s, keep_s
        self._entries: dict[str, _Entry] = {}
        self._by_key: dict[tuple[str, int], str] = {}
        self._ids = itertools.count(1)

    def existing(self, dedupe_key: tuple[str, int] | None) -> str | None:
        return self._by_key.get(dedupe_key) if dedupe_key is not None else None

    def submit(self, work: Awaitable, dedupe_key: tuple[str, int] | None = None,
               deadline_s: float | None = None) -> str:
        """Start `work` (a coroutine or future) on the running loop; returns its request id."""
        if dedupe_key is not None and dedupe_key in self._by_key:
            close = getattr(work, "close", None)  # the coroutine of a retried POST never runs
            if close is not None:
                close()
            return self._by_key[dedupe_key]
        self._expire()
        request_id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        task = asyncio.ensure_future(work)
        self._entries[request_id] = _Entry(task, time.monotonic() + (deadline_s or self.deadline_s))
        if dedupe_key is not None:
            self._by_key[dedupe_key] = request_id
        return request_id

    def fail_now(self, message: str, category: str = "user") -> str:
        """A future that is already failed (the error of a request refused before any work)."""
        request_id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        done.set_result(None)
        self._entries[request_id] = _Entry(done, time.monotonic(), time.monotonic(), Failed(message, category))
        return request_id

    async def retrieve(self, request_id: str, wait_s: float) -> Outcome:
        """The outcome, waiting up to `wait_s` (and never past the future's deadline) while it runs."""
        entry = self._entries.get(request_id)
        if entry is None:
            return Failed(f"unknown request id {request_id!r}: never issued by this server, or its result "
                          f"expired ({self.keep_s:g} s after it finished)", "server")
        if entry.outcome is None:
            remaining = entry.deadline - time.monotonic()
            if remaining > 0 and not entry.task.done():
                await asyncio.wait([entry.task], timeout=min(wait_s, remaining))
            if entry.task.done():
                entry.outcome = _outcome_of(entry.task)
            elif time.monotonic() >= entry.deadline:
                entry.task.cancel()
                entry.outcome = Failed(f"request {request_id} did not finish within its deadline of "
                                       f"{self.deadline_s:g} s", "server")
            else:
                return Pending()
            entry.finished_at = time.monotonic()
        return entry.outcome

    def _expire(self) -> None:
        now = time.monotonic()
        old = [rid for rid, e in self._entries.items() if e.finished_at is not None and now - e.finished_at > self.keep_s]
        for rid in old:
            del self._entries[rid]
        if old:
            gone = set(old)
            self._by_key = {k: v for k, v in self._by_key.items() if v not in gone}


def _outcome_of(task: asyncio.Future) -> Outcome:
    if task.cancelled():
        return Failed("the request was cancelled (the server is shutting down)", "server")
    error = task.exception()
    if error is None:
        return Done(task.result())
    if isinstance(error, UserError):
        return Failed(str(error), "user")
    return Failed(f"{type(error).__name__}: {error}", "server")
