"""Keep an EngineGroup serving: notice a dead or hung engine, take it out of the router, restart it,
put it back. Requests that were on it fail and are retried by the rollout through the router, which
by then routes only to live engines (see rollout/default.py), so no sample is lost or duplicated.

Runs on its own thread for the life of the group; the replacement servers are started by their engine
actors (engine_actor.py), so the thread may stop before the group does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterator

import httpx

from lean_rl.backends.sglang.config import auth_headers
from lean_rl.backends.sglang.engines import EngineGroup

logger = logging.getLogger(__name__)


@dataclass
class EngineHealth:
    consecutive_failures: int = 0
    restarts: int = 0
    gave_up: bool = False
    events: list[str] = field(default_factory=list)


class EngineMonitor:
    def __init__(self, group: EngineGroup, interval_s: float = 2.0, health_timeout_s: float = 10.0,
                 failures_before_restart: int = 3, max_restarts: int = 5):
        """An engine whose process exited is restarted at once; one that is alive but fails
        `failures_before_restart` health checks in a row (each bounded by `health_timeout_s`) is
        treated as hung. After `max_restarts` restarts of the same engine it stays out of the router."""
        self.group = group
        self.interval_s, self.health_timeout_s = interval_s, health_timeout_s
        self.failures_before_restart, self.max_restarts = failures_before_restart, max_restarts
        self.health = [EngineHealth() for _ in group.engine_urls]
        self._stop = threading.Event()
        self._held = threading.Event()
        self._thread: threading.Thread | None = None
        # SGLang 0.5.23 leaves /health open even with an API key; sent anyway, should that change
        self._http = httpx.Client(timeout=health_timeout_s, trust_env=False,
                                  headers=auth_headers(group.config.api_key))

    def start(self) -> EngineMonitor:
        self._thread = threading.Thread(target=self._run, name="lean_rl-engine-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("engine monitor did not stop within %.0f s (a restart in progress?)", timeout_s)
        self._http.close()

    def __enter__(self) -> EngineMonitor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @contextlib.contextmanager
    def hold_health_checks(self) -> Iterator[None]:
        """While engines are paused on purpose (a weight update in fully async training), SGLang's
        /health fails (it needs a generation to go through): check only that the processes live."""
        self._held.set()
        try:
            yield
        finally:
            for state in self.health:
                state.consecutive_failures = 0
            self._held.clear()

    @property
    def total_restarts(self) -> int:
        return sum(h.restarts for h in self.health)

    def check_once(self) -> None:
        for index, state in enumerate(self.health):
            if self._stop.is_set() or state.gave_up:
                continue
            if not self.group.engine_alive(index):
                self._restart(index, state, "its process exited")
            elif self._held.is_set():
                continue
            elif not self._healthy(index):
                state.consecutive_failures += 1
                if state.consecutive_failures >= self.failures_before_restart:
                    self._restart(index, state, f"{state.consecutive_failures} failed health checks in a row")
            else:
                state.consecutive_failures = 0

    def _healthy(self, index: int) -> bool:
        try:
            return self._http.get(f"{self.group.engine_url(index)}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _restart(self, index: int, state: EngineHealth, reason: str) -> None:
        url = self.group.engine_url(index)
        if state.restarts >= self.max_restarts:
            state.gave_up = True
            self._note(state, f"{url}: {reason}; restarted {state.restarts} times already, leaving it out")
            self.group.remove_engine(index)
            return
        self._note(state, f"{url}: {reason}; restarting (log: {self.group.engine_log_path(index)})")
        try:
            seconds = self.group.restart_engine(index)
        except Exception as err:  # noqa: BLE001 - keep watching; the next round tries again
            state.restarts += 1
            self._note(state, f"{url}: restart failed: {type(err).__name__}: {err}")
            return
        state.restarts += 1
        state.consecutive_failures = 0
        self._note(state, f"{url}: back in the router after {seconds:.1f} s")

    def _note(self, state: EngineHealth, message: str) -> None:
        state.events.append(message)
        logger.warning("engine monitor: %s", message)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except Exception:  # noqa: BLE001 - a monitor that dies silently is worse than a noisy one
                logger.exception("engine monitor check failed")
