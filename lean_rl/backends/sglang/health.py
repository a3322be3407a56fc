"""Keep an EngineGroup serving: notice a dead or hung engine, take it out of the router, restart it,
put it back; and a dead or hung router: start it again on its port with the engines that serve. Requests that were on it fail and are retried by the rollout through the router, which
by then routes only to live engines (see rollout/default.py), so no sample is lost or duplicated.

A restarted server serves --hf-checkpoint, not the trainer's weights. With a `rejoin` callback (the
run's: weight_sync/engine_weights.py) the engine goes back into the router only once the callback has
given it the current weights (and version) and their probe passed; until then it is "awaiting
weights" and the callback is tried again every round, or a full sync delivers them
(weights_delivered). Without a callback (an engine group on its own) it goes back at once.

Runs on its own thread for the life of the group; the replacement servers are started by their engine
actors (engine_actor.py), so the thread may stop before the group does. A restart (tens of seconds) and
the rejoin after it run on a thread of their own per engine: meanwhile the monitor goes on watching the
other engines and the router, and the run goes on with the engines that serve.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import httpx

from lean_rl.backends.sglang.engine_http import KEEPALIVE_EXPIRY_S
from lean_rl.backends.sglang.engines import EngineGroup

logger = logging.getLogger(__name__)


@dataclass
class EngineHealth:
    consecutive_failures: int = 0
    restarts: int = 0
    gave_up: bool = False
    awaiting_weights: bool = False  # restarted, out of the router until it holds the current weights
    last_rejoin_error: str | None = None
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
        # called with an engine's index after its restart, before it rejoins the router (see above)
        self.rejoin: Callable[[int], None] | None = None
        self._restarting: set[int] = set()
        self._working: dict[int, threading.Thread] = {}  # engine -> the thread restarting or rejoining it
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._holds = 0  # hold_health_checks nests (a sync inside the async loop's pause)
        self.router_restarts = 0
        self.router_events: list[str] = []
        self._router_failures = 0
        self._thread: threading.Thread | None = None
        # /health (SGLang) and /liveness (sglang-router) need no key, so these polls send none: after
        # a server dies, whatever binds its port next must not learn the key from them
        self._http = httpx.Client(timeout=health_timeout_s, trust_env=False,
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))  # engine_http.py

    def start(self) -> EngineMonitor:
        self._thread = threading.Thread(target=self._run, name="lean_rl-engine-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        with self._state_lock:
            workers = list(self._working.values())
        for thread in [self._thread, *workers]:
            if thread is not None:
                thread.join(max(deadline - time.monotonic(), 0.0))
                if thread.is_alive():
                    logger.warning("engine monitor: %s did not stop within %.0f s (a restart in progress?)",
                                   thread.name, timeout_s)
        self._http.close()

    def __enter__(self) -> EngineMonitor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @contextlib.contextmanager
    def hold_health_checks(self) -> Iterator[None]:
        """While engines are paused on purpose (a weight update in fully async training), SGLang's
        /health fails (it needs a generation to go through): check only that the processes live."""
        with self._state_lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._holds -= 1
                for state in self.health:
                    state.consecutive_failures = 0

    @property
    def total_restarts(self) -> int:
        return sum(h.restarts for h in self.health)

    @property
    def awaiting_weights(self) -> list[int]:
        return [i for i, state in enumerate(self.health) if state.awaiting_weights and not state.gave_up]

    def weights_delivered(self) -> None:
        """Every engine holds the current weights (a sync to all of them just passed): the ones that
        awaited them go back into the router."""
        for index in self.awaiting_weights:
            if self.group.engine_alive(index):
                self._back_in_router(index, self.health[index], "with the weights of the last sync")

    def wait_until_serving(self, timeout_s: float, restarts_before: int, settle_s: float | None = None) -> bool:
        """After a failure that may be an engine's death: wait until every engine lives again and no
        restart is in progress. True when some engine was restarted since `restarts_before` (the
        failure was an engine's), False when, after `settle_s` (long enough for the monitor to notice a
        dead one), none was. Raises when an engine is given up or the deadline passes."""
        settle_s = 3 * self.interval_s + 2 if settle_s is None else settle_s
        started = time.monotonic()
        while True:
            given_up = [i for i, state in enumerate(self.health) if state.gave_up]
            if given_up:
                raise RuntimeError(f"engines {given_up} were restarted {self.max_restarts} times and left out")
            with self._state_lock:
                busy = bool(self._restarting)
            serving = not busy and all(self.group.engine_alive(i) for i in range(len(self.health)))
            if serving and self.total_restarts > restarts_before:
                return True
            if serving and time.monotonic() - started >= settle_s:
                return False
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"engines not serving again within {timeout_s:.0f} s: "
                                   f"{[state.events[-1:] for state in self.health]}")
            time.sleep(0.5)

    def check_once(self, background: bool = False) -> None:
        """One round over the router and every engine. `background` (the monitor's own thread): each
        restart or rejoin runs on a thread of its own and the round goes on; otherwise (called by hand)
        they are done in place."""
        run = self._in_background if background else lambda index, fn, *args: fn(*args)
        self._check_router()
        for index, state in enumerate(self.health):
            with self._state_lock:
                working = index in self._working
            if self._stop.is_set() or state.gave_up or working:
                continue
            if not self.group.engine_alive(index):
                run(index, self._restart, index, state, "its process exited")
            elif state.awaiting_weights:
                run(index, self._try_rejoin, index, state)
            elif self._holds:
                continue
            elif not self._healthy(index):
                state.consecutive_failures += 1
                if state.consecutive_failures >= self.failures_before_restart:
                    run(index, self._restart, index, state,
                        f"{state.consecutive_failures} failed health checks in a row")
            else:
                state.consecutive_failures = 0

    def _in_background(self, index: int, fn, *args) -> None:
        """`fn(*args)` (engine `index`'s restart or rejoin) on a thread of its own; the engine is skipped
        by later rounds until it is done."""
        def work() -> None:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a monitor that dies silently is worse than a noisy one
                logger.exception("engine monitor: work on engine %d failed", index)
            finally:
                with self._state_lock:
                    self._working.pop(index, None)

        thread = threading.Thread(target=work, name=f"lean_rl-engine-monitor-{index}", daemon=True)
        with self._state_lock:
            self._working[index] = thread
        thread.start()

    def _check_router(self) -> None:
        if self._stop.is_set() or self.router_restarts >= self.max_restarts:
            return
        if self.group.router_alive():
            if self._router_live():
                self._router_failures = 0
                return
            self._router_failures += 1
            if self._router_failures < self.failures_before_restart:
                return
            reason = f"{self._router_failures} failed liveness checks in a row"
        else:
            reason = "its process exited"
        serving = [i for i, state in enumerate(self.health)
                   if not state.awaiting_weights and not state.gave_up and self.group.engine_alive(i)]
        self._router_note(f"router {self.group.router_url}: {reason}; restarting it with engines {serving}")
        self.router_restarts += 1
        try:
            seconds = self.group.restart_router(serving)
        except Exception as err:  # noqa: BLE001 - the next round tries again
            self._router_note(f"router restart failed: {type(err).__name__}: {err}")
            return
        self._router_failures = 0
        self._router_note(f"router {self.group.router_url}: back after {seconds:.1f} s")

    def _router_live(self) -> bool:
        # /liveness: the router's own process answers (its /health may depend on the workers')
        try:
            return self._http.get(f"{self.group.router_url}/liveness").status_code == 200
        except httpx.HTTPError:
            return False

    def _router_note(self, message: str) -> None:
        self.router_events.append(message)
        logger.warning("engine monitor: %s", message)

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
        with self._state_lock:
            self._restarting.add(index)
        try:
            seconds = self.group.restart_engine(index, add_back=self.rejoin is None)
        except Exception as err:  # noqa: BLE001 - keep watching; the next round tries again
            state.restarts += 1
            self._note(state, f"{url}: restart failed: {type(err).__name__}: {err}")
            return
        finally:
            with self._state_lock:
                self._restarting.discard(index)
        state.restarts += 1
        state.consecutive_failures = 0
        if self.rejoin is None:
            self._note(state, f"{url}: back in the router after {seconds:.1f} s")
            return
        state.awaiting_weights, state.last_rejoin_error = True, None
        self._note(state, f"{self.group.engine_url(index)}: healthy after {seconds:.1f} s; out of the router "
                          "until it holds the current weights")
        self._try_rejoin(index, state)

    def _try_rejoin(self, index: int, state: EngineHealth) -> None:
        try:
            self.rejoin(index)
        except Exception as err:  # noqa: BLE001 - stays out of the router; tried again next round
            message = f"{type(err).__name__}: {err}"
            if message != state.last_rejoin_error:  # said once, not every round
                state.last_rejoin_error = message
                self._note(state, f"{self.group.engine_url(index)}: not given the current weights yet ({message})")
            return
        self._back_in_router(index, state, "with the current weights")

    def _back_in_router(self, index: int, state: EngineHealth, how: str) -> None:
        with self._state_lock:
            if not state.awaiting_weights:
                return
            state.awaiting_weights = False
        self.group.add_engine(index)
        self._note(state, f"{self.group.engine_url(index)}: back in the router {how}")

    def _note(self, state: EngineHealth, message: str) -> None:
        state.events.append(message)
        logger.warning("engine monitor: %s", message)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once(background=True)
            except Exception:  # noqa: BLE001 - a monitor that dies silently is worse than a noisy one
                logger.exception("engine monitor check failed")
