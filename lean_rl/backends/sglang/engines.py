"""Start, stop and restart a group of SGLang servers with sglang-router in front of them.

    with EngineGroup(config, run_dir) as engines:
        engines.router_url          # generation goes here
        engines.engine_urls         # weight updates, abort, pause/continue go to every engine

One path on one node and on a cluster: every server is owned by a Ray actor (engine_actor.py; the
group's servers: engine_servers.py) placed by engine_placement.py (its own placement group reserving
each engine's GPUs, the trainer's bundles with --colocate, or a pinned node). An actor binds
`--sglang-host` (loopback) on one node and its node's Ray address on a cluster, and reports its URL;
`self.config` then carries the reported URLs (config.engine_urls / router_url) for code that holds only
the config. The router is a child of this process, bound to `--sglang-host` on one node and to this
node's Ray address on a cluster. Logs: run_dir/engine-<i>.log, run_dir/router.log. Start-up is parallel:
the router starts while the servers import, and each server joins the router once healthy. The router
dies with this process and every server with its actor, which Ray ends with its owner (this driver): a
crashed driver leaves no orphans.
Without a running Ray, start() starts a local one (and stop() shuts it down again).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import time
from pathlib import Path

import ray

from lean_rl.options import rebuild
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key
from lean_rl.backends.sglang.command_line import flags_to_dict
from lean_rl.backends.sglang.engine_placement import EnginePlacement, EngineScheduler
from lean_rl.backends.sglang.engine_servers import EngineServers, EngineStartError
from lean_rl.backends.sglang.key_placement import place_key_file
from lean_rl.backends.sglang.listener_agent import start_agents
from lean_rl.backends.sglang.model_check import ModelDirInfo, check_model_dir
from lean_rl.backends.sglang.processes import ChildProcess, ChildStartError, stop_all, wait_until_healthy
from lean_rl.backends.sglang.router import RouterAdmin
from lean_rl.backends.sglang.server_command import router_command
from lean_rl.utils.net import find_free_port, require_free_port, service_host

__all__ = ["EngineGroup", "EnginePlacement", "EngineStartError"]

logger = logging.getLogger(__name__)


class EngineGroup:
    def __init__(self, config: EngineConfig, run_dir: str | Path, *, stop_timeout_s: float = 15.0,
                 placement: EnginePlacement | None = None, name: str = "engines"):
        # `name`: of this group in logs and of its Ray placement group (a run may hold two: the --use-opd teacher's)
        self.name = name
        # A key given as a plain str (not through resolve_api_key) gets its private file here: the
        # actors receive the config pickled, and the key travels only as its file's path (run_key.py).
        if config.api_key_resolved:
            config = resolve_api_key(config, environ={})
        # Absolute paths: the servers run in their actors' working directory, not necessarily this one.
        self.config = rebuild(config, model_path=str(Path(config.model_path).resolve())) \
            if config.model_path else config
        self.run_dir = Path(run_dir).resolve()
        self.stop_timeout_s = stop_timeout_s
        self.router_port: int | None = None
        self.model_info: ModelDirInfo | None = None
        self.timings: dict[str, float] = {}  # seconds: router_healthy, servers_healthy, total
        self._scheduler = EngineScheduler(self.config, placement, name=name)
        self._servers = EngineServers(self.config, self._scheduler, self.run_dir, stop_timeout_s)  # engine_servers.py
        self._router: ChildProcess | None = None
        self._router_host = service_host(True) if config.on_cluster else config.host
        self._started = False
        self._ray_started = False
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ addresses
    @property
    def engine_urls(self) -> list[str]:
        return list(self._servers.urls)

    def engine_url(self, index: int) -> str:
        return self._servers.urls[index]

    @property
    def router_url(self) -> str:
        if self.router_port is None:
            raise RuntimeError("EngineGroup is not started")
        return f"http://{self._router_host}:{self.router_port}"

    @property
    def router(self) -> RouterAdmin:
        """The router's worker API (list / add / remove servers)."""
        return RouterAdmin(self.router_url, api_key=self.config.api_key)

    def router_client(self) -> EngineClient:
        """Async client for generation through the router, with --engine-request-timeout."""
        return EngineClient(self.router_url, timeout_s=self.config.request_timeout_s, api_key=self.config.api_key,
                            adapter=self.config.adapter_name)

    def engine_clients(self) -> list[EngineClient]:
        """One async client per server: weight updates, abort, pause/continue go to each of them."""
        return [EngineClient(url, timeout_s=self.config.request_timeout_s, api_key=self.config.api_key,
                             adapter=self.config.adapter_name) for url in self.engine_urls]

    def pids(self) -> dict[str, list[int]]:
        """Live pids of every process tree this group started, by name (engine-<i>, router)."""
        pids = {} if self._router is None else {"router": self._router.tree_pids()}
        return {**pids, **self._servers.tree_pids()}

    def engine_log_path(self, index: int) -> Path:
        return self._servers.log_path(index)

    def engine_log_tail(self, index: int, lines: int = 40) -> str:
        """The last lines of engine `index`'s server log (read by its actor, on its node)."""
        return self._servers.log_tail(index, lines)

    def engine_alive(self, index: int) -> bool:
        """The actor answers and its server process lives."""
        return self._servers.alive(index)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EngineGroup:
        if self._started:
            raise RuntimeError("EngineGroup.start() called twice")
        self._started = True
        server_flags = flags_to_dict(self.config.server_passthrough)
        self.model_info = check_model_dir(
            self.config.model_path,
            tokenizer_path=(server_flags.get("--tokenizer-path") or [None])[0],
            skip_tokenizer_init="--skip-tokenizer-init" in server_flags,
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._ensure_ray()
        self.router_port = self._check_ports()
        atexit.register(self.stop)
        t0 = time.monotonic()
        # SGLang's import and model load take ~20-30 s per server on CPU: say so before the silence
        logger.info("%s: starting %d SGLang server(s) and a router (waits up to %.0f s for them)", self.name,
                    self.config.num_engines, self.config.start_timeout_s)
        try:
            self._router = self._spawn_router()
            self._scheduler.reserve()
            # the driver's key file to the engines' nodes before their actors unpickle its path there
            place_key_file(self.config.api_key, self._scheduler.node_ids(), timeout_s=self.config.start_timeout_s)
            start_agents(self.config.api_key, self._scheduler.node_ids())  # they check the servers' listeners there
            self._servers.start()
            self._wait_router_healthy()
            self.timings["router_healthy"] = time.monotonic() - t0
            self._servers.wait_healthy(list(range(self.config.num_engines)))
            self.timings["servers_healthy"] = time.monotonic() - t0
            for url in self._servers.urls:
                self.router.add_worker(url)
            self._publish_urls()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        logger.info("%s %s and router %s ready in %.1f s", self.name, self._servers.urls, self.router_url,
                    self.timings["total"])
        return self

    def stop(self) -> None:
        """Stop the router, then every server (each actor stops its own: SIGTERM, wait, SIGKILL), the
        actors and their placement group. Safe to call twice."""
        atexit.unregister(self.stop)
        t0 = time.monotonic()
        had_any = self._router is not None or bool(self._servers.actors)
        try:
            try:
                if self._router is not None:
                    stop_all([self._router], self.stop_timeout_s)
            finally:
                self._servers.stop()
                self._scheduler.release()
        finally:
            if self._spawner is not None:  # only after the router is gone: it dies with this thread
                self._spawner.shutdown(wait=True)
                self._spawner = None
            if self._ray_started:
                self._ray_started = False
                ray.shutdown()
        if had_any:
            logger.info("engine group %s stopped in %.1f s", self.name, time.monotonic() - t0)

    def __enter__(self) -> EngineGroup:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ------------------------------------------------------------------ router membership, restart
    def remove_engine(self, index: int) -> None:
        """Take engine `index` out of the router (its server keeps running)."""
        self.router.remove_worker(self.engine_url(index))

    def add_engine(self, index: int) -> None:
        """Put engine `index` (back) into the router; returns once the router routes to it."""
        self.router.add_worker(self.engine_url(index))

    def restart_engine(self, index: int, add_back: bool = True) -> float:
        """Remove engine `index` from the router, restart its server (through its actor, on the same
        port), re-add it unless `add_back` is False (it serves --hf-checkpoint: the caller gives it the
        current weights first). An actor that is gone (its node lost) is replaced by a new one where Ray
        places it, whose URL may differ: the group's and its config's URLs follow. Returns the seconds
        until it was healthy again."""
        self.remove_engine(index)
        try:
            restarted = self._servers.actors[index].restart.remote()
            seconds = self._servers.get(restarted, self.config.start_timeout_s + 60)
        except ray.exceptions.RayActorError:
            seconds = self._servers.replace(index)
            self._publish_urls()
        if add_back:
            self.add_engine(index)
        return seconds

    def router_alive(self) -> bool:
        return self._router is not None and self._router.alive()

    def restart_router(self, engine_indices: list[int]) -> float:
        """Start the router again on its port (a hung one is stopped first) and register the engines
        `engine_indices` (those that serve the current weights). Returns the seconds it took."""
        t0 = time.monotonic()
        old, self._router = self._router, None
        if old is not None:
            stop_all([old], self.stop_timeout_s)
        require_free_port(self.router_port, "the router's port (restart)", self._router_host)
        self._router = self._spawn_router()
        self._wait_router_healthy()
        for index in engine_indices:
            self.add_engine(index)
        return time.monotonic() - t0

    # ------------------------------------------------------------------ internals
    def _ensure_ray(self) -> None:
        if ray.is_initialized():
            return
        if self.config.on_cluster:
            raise RuntimeError("EngineGroup on a cluster (--ray-address) needs ray.init first (utils.ray_utils.init_ray)")
        from lean_rl.utils.ray_utils import init_ray

        self._ray_started = init_ray()

    def _check_ports(self) -> int:
        """The router's port; on one node also check the engines' (chosen by the run), so that a port
        taken since fails now, with the flag's name. On a cluster each actor picks a port on its node."""
        config, host = self.config, self._router_host
        if not config.on_cluster:
            engine_flag = "--sglang-base-port" if config.base_port is not None else "an engine port chosen at start-up"
            for port in config.engine_ports:
                require_free_port(port, engine_flag, host)
        port = config.resolved_router_port if not config.on_cluster else None
        port = port or config.router_port or find_free_port(host)
        router_flag = "--router-port" if config.router_port is not None else "the router port chosen at start-up"
        require_free_port(port, router_flag, host)
        return port

    def _publish_urls(self) -> None:
        self.config.live.publish(self._servers.urls, self.router_url)

    def _spawn_router(self) -> ChildProcess:
        # Its metrics port is nobody else's business: chosen now, not in the config, so that it has
        # no time to be taken (a router that cannot bind it panics at start).
        host = self._router_host
        metrics_port = find_free_port(host)
        while metrics_port in (*self.config.engine_ports, self.router_port):
            metrics_port = find_free_port(host)
        config = self.config if host == self.config.host else rebuild(self.config, host=host)
        assert self.router_port is not None  # start() chose it (_check_ports) before any router starts
        cmd = router_command(config, self.router_port, metrics_port)  # the key goes in env, never argv
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", **config.router_env()}
        # The router dies with the *thread* that started it (PR_SET_PDEATHSIG, see processes.py), and
        # a restart may come from another thread: start it from one thread that lives as long as this group.
        if self._spawner is None:
            self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lean_rl-router")
        return self._spawner.submit(ChildProcess, "router", cmd, self.run_dir / "router.log", env=env).result()

    def _wait_router_healthy(self) -> float:
        try:
            return wait_until_healthy([(self._router, f"{self.router_url}/health")], self.config.start_timeout_s)
        except ChildStartError as exc:
            raise EngineStartError(f"sglang-router failed to start: {exc}") from None
