"""The SGLang servers of an engine group (engines.py), each owned by a Ray actor (engine_actor.py) that
the group's scheduler places (engine_placement.py): starting them, waiting until they are healthy,
replacing one whose actor is gone, their logs (run_dir/engine-<i>.log, read by each actor on its node)
and pids, and stopping them."""

from __future__ import annotations

import logging
import time
import urllib.parse
from pathlib import Path

import ray

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.engine_actor import EngineActor
from lean_rl.backends.sglang.engine_placement import EngineScheduler
from lean_rl.backends.sglang.processes import ChildStartError

logger = logging.getLogger(__name__)


class EngineStartError(ChildStartError):
    """A server or the router failed to start; the message holds the tail of its log."""


class EngineServers:
    def __init__(self, config: EngineConfig, scheduler: EngineScheduler, run_dir: Path, stop_timeout_s: float):
        self.config = config
        self.scheduler = scheduler
        self.run_dir = run_dir
        self.stop_timeout_s = stop_timeout_s
        self.actors: list = []
        self.urls: list[str] = []  # per engine: the URL its actor reported

    def log_path(self, index: int) -> Path:
        return self.run_dir / f"engine-{index}.log"

    def log_tail(self, index: int, lines: int = 40) -> str:
        """The last lines of engine `index`'s server log (read by its actor, on its node)."""
        try:
            return ray.get(self.actors[index].log_tail.remote(lines), timeout=30)
        except Exception as exc:  # noqa: BLE001
            return f"<engine {index}: no log tail ({type(exc).__name__}: {exc})>"

    def alive(self, index: int) -> bool:
        """The actor answers and its server process lives."""
        try:
            return bool(ray.get(self.actors[index].alive.remote(), timeout=30))
        except Exception:  # noqa: BLE001 - actor dead, node gone, or no answer: not alive
            return False

    def tree_pids(self) -> dict[str, list[int]]:
        """Live pids of each server's process tree, by name (engine-<i>)."""
        pids = {}
        for index, actor in enumerate(self.actors):
            try:
                pids[f"engine-{index}"] = ray.get(actor.tree_pids.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor has no server left (PDEATHSIG)
                pids[f"engine-{index}"] = []
        return pids

    def start(self) -> None:
        """One actor per engine, each starting its server; `urls` holds what they report."""
        assert self.config.num_engines is not None  # EngineConfig.derive_fields set it
        self.actors = [self._new_actor(i) for i in range(self.config.num_engines)]
        try:
            self.urls = list(self.get([a.start.remote() for a in self.actors], self.config.start_timeout_s))
        except ray.exceptions.RayActorError as exc:  # its constructor failed (e.g. a taken --sglang-base-port)
            raise EngineStartError(f"an engine actor could not start: {exc}") from None

    def _new_actor(self, index: int):
        options, visible_devices = self.scheduler.actor_options(index)
        return ray.remote(EngineActor).options(**options).remote(
            self.config, index, str(self.log_path(index)), stop_timeout_s=self.stop_timeout_s,
            visible_devices=visible_devices)

    def get(self, refs, timeout_s: float):
        """ray.get, with a server's start failure raised as EngineStartError (its message, log tail included)."""
        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
            if isinstance(cause, ValueError):  # a port check in the actor: the flag's message as is
                raise cause from None
            raise EngineStartError(str(cause or exc)) from None

    def wait_healthy(self, indices: list[int]) -> float:
        t0 = time.monotonic()
        self.get([self.actors[i].wait_healthy.remote() for i in indices], self.config.start_timeout_s + 30)
        return time.monotonic() - t0

    def replace(self, index: int) -> float:
        """A new actor and server for engine `index`, whose actor is gone, where Ray places it (the
        group publishes its URL, new on a cluster); the seconds until it is healthy."""
        url = self.urls[index] if index < len(self.urls) else "?"
        node = urllib.parse.urlsplit(url).hostname or "?"
        logger.warning("engine %d (%s) on node %s: its actor is gone%s; starting a new engine where Ray places it "
                       "(a new URL on a cluster)", index, url, node,
                       " (node lost: Ray reports it dead)" if node in _dead_nodes() else "")
        _kill_actor(self.actors[index])
        t0 = time.monotonic()
        self.actors[index] = self._new_actor(index)
        self.urls[index] = self.get(self.actors[index].start.remote(), self.config.start_timeout_s)
        self.wait_healthy([index])
        return time.monotonic() - t0

    def stop(self) -> None:
        """Each actor stops its server (bounded), then the actors go."""
        actors, self.actors = self.actors, []
        if not actors:
            return
        try:
            ray.get([actor.shutdown.remote() for actor in actors], timeout=self.stop_timeout_s + 15)
        except Exception as exc:  # noqa: BLE001 - killing the actor still takes its server down (PDEATHSIG)
            logger.warning("engine actors did not all stop their servers cleanly: %s", exc)
        for actor in actors:
            _kill_actor(actor)


def _kill_actor(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def _dead_nodes() -> set[str]:
    """Addresses of the nodes Ray reports dead (and not alive again); empty when Ray cannot say."""
    try:
        nodes = ray.nodes()
    except Exception:  # noqa: BLE001
        return set()
    alive = {n["NodeManagerAddress"] for n in nodes if n["Alive"]}
    return {n["NodeManagerAddress"] for n in nodes if not n["Alive"]} - alive
