"""Start, stop and restart a group of SGLang servers with sglang-router in front of them.

    with EngineGroup(config, run_dir) as engines:
        engines.router_url          # generation goes here
        engines.engine_urls         # weight updates, abort, pause/continue go to every engine

Every server is `python -m lean_rl.backends.sglang.launch <flags>` (CPU patches applied from argv)
on a 127.0.0.1 port; its log is run_dir/engine-<i>.log, the router's run_dir/router.log. Start-up is
parallel: the router starts while the servers import, and each server joins the router once healthy.
Children die with this process (see processes.py), so a crashed driver leaves no orphans.

On a cluster (`config.on_cluster`, from --ray-address) each server is owned instead by a Ray actor
(engine_actor.py) placed on a cluster node by a placement group (one bundle per engine, SPREAD) or
pinned to `config.engine_nodes`: it binds that node's Ray address on a port free there and reports
its URL; the router stays a child of this process and binds this node's Ray address
(utils.net.service_host). `self.config` then carries the reported URLs (config.engine_urls /
router_url), for code that only holds the config.

With --colocate on a cluster the engines go instead into the trainer's placement group
(`EnginePlacement`, built by runtime.py from the MegatronGroup): engine i into the bundle of the
trainer node whose devices it takes turns on, with the share of that bundle the ranks leave free.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.config import EngineConfig, flags_to_dict, resolve_ports
from lean_rl.backends.sglang.model_check import ModelDirInfo, check_model_dir
from lean_rl.backends.sglang.processes import ChildProcess, ChildStartError, stop_all, wait_until_healthy
from lean_rl.backends.sglang.router import RouterAdmin
from lean_rl.utils.net import find_free_port, require_free_port, service_host

logger = logging.getLogger(__name__)

# Failures after which an SGLang server hangs instead of exiting (uvicorn fails to bind, then the
# server waits forever in "Waiting for application shutdown"): detect them in the log.
SERVER_FATAL_LOG_LINES = {
    "error while attempting to bind on address": "cannot bind its port (another process took it)",
}


# <base>/lean_rl_sglang<i>_XXXXXXXX/tmpXXXXXXXX must stay under the 107-byte unix socket path limit.
_MAX_TMP_BASE_LEN = 70


@dataclass(frozen=True)
class EnginePlacement:
    """Engines placed into another group's placement group (the trainer's, colocated): per engine its
    bundle index, its Ray resources there ({"CPU": .., "GPU": ..}, fractions of the bundle) and, on
    GPU, the GPU ids its server uses (CUDA_VISIBLE_DEVICES; Ray's own choice for a fraction is one
    GPU). The placement group belongs to its creator: stop() leaves it alone."""

    placement_group: Any
    bundle_indices: tuple[int, ...]
    resources: tuple[dict[str, float], ...]
    visible_devices: tuple[tuple[str, ...], ...] = ()


class EngineStartError(ChildStartError):
    """A server or the router failed to start; the message holds the tail of its log."""


class EngineGroup:
    def __init__(self, config: EngineConfig, run_dir: str | Path, *, stop_timeout_s: float = 15.0,
                 placement: EnginePlacement | None = None):
        self.config = config
        self.run_dir = Path(run_dir)
        self.stop_timeout_s = stop_timeout_s
        self.engine_ports: list[int] = []
        self.router_port: int | None = None
        self.model_info: ModelDirInfo | None = None
        self.timings: dict[str, float] = {}  # seconds: servers_healthy, router_healthy, total
        self._servers: list[ChildProcess | None] = []
        self._router: ChildProcess | None = None
        self._server_tmp_dirs: dict[int, str] = {}
        self._started = False
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None
        # cluster path: one engine actor per engine, the URLs they reported, their placement group
        self.on_cluster = config.on_cluster
        self._actors: list = []
        self._urls: list[str] = []
        self._placement_group = None  # our own (SPREAD); not set when `placement` is given
        self._placement = placement
        if placement is not None and (not self.on_cluster or config.engine_nodes
                                      or len(placement.bundle_indices) != config.num_engines):
            raise ValueError(f"EngineGroup: a placement for {len(placement.bundle_indices)} engines needs a cluster "
                             f"config of as many engines ({config.num_engines}) and no engine_nodes")
        self._router_host = config.host

    # ------------------------------------------------------------------ addresses
    @property
    def engine_urls(self) -> list[str]:
        if self.on_cluster:
            return list(self._urls)
        return [self.engine_url(i) for i in range(len(self.engine_ports))]

    def engine_url(self, index: int) -> str:
        if self.on_cluster:
            return self._urls[index]
        return f"http://{self.config.host}:{self.engine_ports[index]}"

    @property
    def router_url(self) -> str:
        if self.router_port is None:
            raise RuntimeError("EngineGroup is not started")
        return f"http://{self._router_host}:{self.router_port}"

    @property
    def router(self) -> RouterAdmin:
        """The router's worker API (list / add / remove servers)."""
        return RouterAdmin(self.router_url)

    def router_client(self) -> EngineClient:
        """Async client for generation through the router, with --engine-request-timeout."""
        return EngineClient(self.router_url, timeout_s=self.config.request_timeout_s)

    def engine_clients(self) -> list[EngineClient]:
        """One async client per server: weight updates, abort, pause/continue go to each of them."""
        return [EngineClient(url, timeout_s=self.config.request_timeout_s) for url in self.engine_urls]

    def pids(self) -> dict[str, list[int]]:
        """Live pids of every process tree this group started, by name (engine-<i>, router)."""
        children = [c for c in [*self._servers, self._router] if c is not None]
        pids = {c.name: c.tree_pids() for c in children}
        if self.on_cluster:
            import ray

            for index, actor in enumerate(self._actors):
                try:
                    pids[f"engine-{index}"] = ray.get(actor.tree_pids.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a dead actor has no server left (PDEATHSIG)
                    pids[f"engine-{index}"] = []
        return pids

    def engine_log_path(self, index: int) -> Path:
        return self.run_dir / f"engine-{index}.log"

    def engine_log_tail(self, index: int, lines: int = 40) -> str:
        """The last lines of engine `index`'s server log (read by its actor on a cluster)."""
        if self.on_cluster:
            import ray

            try:
                return ray.get(self._actors[index].log_tail.remote(lines), timeout=30)
            except Exception as exc:  # noqa: BLE001
                return f"<engine {index}: no log tail ({type(exc).__name__}: {exc})>"
        server = self._servers[index]
        return "" if server is None else server.log_tail(lines)

    def engine_alive(self, index: int) -> bool:
        if self.on_cluster:  # the actor answers, and its server process lives
            import ray

            try:
                return bool(ray.get(self._actors[index].alive.remote(), timeout=30))
            except Exception:  # noqa: BLE001 - actor dead, node gone, or no answer: not alive
                return False
        server = self._servers[index]
        return server is not None and server.alive()

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
        if self.on_cluster:
            return self._start_on_cluster()
        self._choose_ports()
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self._router = self._spawn_router()
            self._servers = [self._spawn_server(i) for i in range(self.config.num_engines)]
            self._wait_router_healthy(self.config.start_timeout_s)
            self.timings["router_healthy"] = time.monotonic() - t0
            self._wait_healthy(list(range(self.config.num_engines)))
            self.timings["servers_healthy"] = time.monotonic() - t0
            for url in self.engine_urls:
                self.router.add_worker(url)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        logger.info("engines %s and router %s ready in %.1f s", self.engine_urls, self.router_url, self.timings["total"])
        return self

    def stop(self) -> None:
        """Stop the router, then every server tree (SIGTERM, wait, SIGKILL). Safe to call twice."""
        atexit.unregister(self.stop)
        children = [c for c in [self._router, *self._servers] if c is not None]
        t0 = time.monotonic()
        try:
            try:
                stop_all(children, self.stop_timeout_s)
            finally:
                if self._actors or self._placement_group is not None:
                    self._stop_actors()
        finally:
            for index in list(self._server_tmp_dirs):
                self._remove_tmp_dir(index)
            if self._spawner is not None:  # only after the children are gone: they die with its thread
                self._spawner.shutdown(wait=True)
                self._spawner = None
        if children:
            logger.info("engine group stopped in %.1f s", time.monotonic() - t0)

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

    def restart_engine(self, index: int) -> float:
        """Remove engine `index` from the router, restart its server on the same port, re-add it.
        Returns the seconds until it was healthy again."""
        self.remove_engine(index)
        if self.on_cluster:
            seconds = self._restart_actor_engine(index)
            self.add_engine(index)
            return seconds
        old = self._servers[index]
        if old is not None:
            old.stop(self.stop_timeout_s)
        self._servers[index] = None
        self._remove_tmp_dir(index)
        require_free_port(self.engine_ports[index], f"engine {index} restart", self.config.host)
        self._servers[index] = self._spawn_server(index)
        seconds = self._wait_healthy([index])
        self.add_engine(index)
        return seconds

    # ------------------------------------------------------------------ internals
    def _choose_ports(self) -> None:
        """Take the ports fixed in the config; fail now, with the flag's name, if one got taken."""
        self.config = resolve_ports(self.config)  # a no-op for a config from parse_config or engine_config_for_tests
        config, host = self.config, self.config.host
        engine_flag = "--sglang-base-port" if config.base_port is not None else "an engine port chosen at start-up"
        for port in config.engine_ports:
            require_free_port(port, engine_flag, host)
        router_flag = "--router-port" if config.router_port is not None else "the router port chosen at start-up"
        require_free_port(config.resolved_router_port, router_flag, host)
        self.engine_ports = list(config.engine_ports)
        self.router_port = config.resolved_router_port

    def _child_env(self) -> dict[str, str]:
        # Unbuffered, so the log tail shown on a failure has the last lines; no ANSI colours in logs.
        return {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}

    def _spawn_server(self, index: int) -> ChildProcess:
        flags = self.config.server_flags(index, self.engine_ports[index])
        cmd = [sys.executable, "-m", "lean_rl.backends.sglang.launch", *flags]
        # SGLang names its ZMQ ipc sockets with tempfile.NamedTemporaryFile(delete=False) and never
        # removes them (sglang/srt/server_args.py PortArgs.init_new): give each server a private
        # TMPDIR that stop() deletes, inside the run directory (so even a killed driver leaves nothing
        # in /tmp) unless that path is too long for an ipc socket path (at most 107 bytes).
        base = self.run_dir if len(str(self.run_dir.resolve())) <= _MAX_TMP_BASE_LEN else None
        tmp_dir = tempfile.mkdtemp(prefix=f"lean_rl_sglang{index}_", dir=base)
        self._server_tmp_dirs[index] = tmp_dir
        env = {**self._child_env(), **self.config.server_env(), "TMPDIR": tmp_dir}
        return self._start_child(f"engine-{index}", cmd, self.engine_log_path(index), env)

    def _remove_tmp_dir(self, index: int) -> None:
        tmp_dir = self._server_tmp_dirs.pop(index, None)
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def _spawn_router(self) -> ChildProcess:
        # Its metrics port is nobody else's business: chosen now, not in the config, so that it has
        # no time to be taken (a router that cannot bind it panics at start).
        host = self._router_host
        metrics_port = find_free_port(host)
        while metrics_port in (*self.engine_ports, self.router_port):
            metrics_port = find_free_port(host)
        config = self.config if host == self.config.host else dataclasses.replace(self.config, host=host)
        flags = config.router_flags(self.router_port, metrics_port)
        cmd = [sys.executable, "-m", "sglang_router.launch_router", *flags]
        return self._start_child("router", cmd, self.run_dir / "router.log", self._child_env())

    def _start_child(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str]) -> ChildProcess:
        # Children die with the *thread* that started them (PR_SET_PDEATHSIG, see processes.py), and
        # restarts come from other threads (the health monitor's). So every child, first start or
        # restart, is started by one thread that lives exactly as long as this group.
        if self._spawner is None:
            self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lean_rl-engines")
        return self._spawner.submit(ChildProcess, name, cmd, log_path, env=env).result()

    def _wait_healthy(self, indices: list[int]) -> float:
        try:
            return wait_until_healthy(
                [(self._servers[i], f"{self.engine_url(i)}/health") for i in indices],
                self.config.start_timeout_s,
                fatal_log_lines=SERVER_FATAL_LOG_LINES,
            )
        except ChildStartError as exc:
            raise EngineStartError(f"SGLang server failed to start: {exc}") from None

    def _wait_router_healthy(self, timeout_s: float) -> float:
        try:
            return wait_until_healthy([(self._router, f"{self.router_url}/health")], timeout_s)
        except ChildStartError as exc:
            raise EngineStartError(f"sglang-router failed to start: {exc}") from None

    # ------------------------------------------------------------------ cluster path (engine actors)
    def _start_on_cluster(self) -> EngineGroup:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("EngineGroup on a cluster (--ray-address) needs ray.init first (utils.ray_utils.init_ray)")
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self._router_host = service_host(on_cluster=True)
            self.router_port = self.config.router_port or find_free_port(self._router_host)
            router_flag = "--router-port" if self.config.router_port is not None else "the router port chosen at start-up"
            require_free_port(self.router_port, router_flag, self._router_host)
            self._router = self._spawn_router()
            self._create_placement()
            self._actors = [self._new_actor(i) for i in range(self.config.num_engines)]
            self._urls = list(ray.get([actor.start.remote() for actor in self._actors], timeout=self.config.start_timeout_s))
            self._wait_router_healthy(self.config.start_timeout_s)
            self.timings["router_healthy"] = time.monotonic() - t0
            self._wait_actors_healthy(list(range(self.config.num_engines)))
            self.timings["servers_healthy"] = time.monotonic() - t0
            for url in self._urls:
                self.router.add_worker(url)
            self._publish_urls()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        logger.info("engine actors %s and router %s ready in %.1f s", self._urls, self.router_url, self.timings["total"])
        return self

    def _publish_urls(self) -> None:
        self.config = dataclasses.replace(self.config, reported_engine_urls=tuple(self._urls),
                                          reported_router_url=self.router_url)

    def _bundle(self) -> dict[str, float]:
        if self.config.device == "cpu":
            return {"CPU": float(self.config.threads_per_cpu_engine)}
        return {"GPU": float(self.config.gpus_per_engine)}

    def _create_placement(self) -> None:
        if self.config.engine_nodes or self._placement is not None:
            return  # pinned by node resource, or placed into the given (trainer's) placement group
        import ray
        from ray.util.placement_group import placement_group

        pg = placement_group([self._bundle() for _ in range(self.config.num_engines)], strategy="SPREAD",
                             name=f"lean_rl-engines-{os.getpid()}")
        self._placement_group = pg
        if not pg.wait(timeout_seconds=self.config.start_timeout_s):
            raise EngineStartError(f"no room in the Ray cluster for {self.config.num_engines} engines of "
                                   f"{self._bundle()} each (placement group not ready after "
                                   f"{self.config.start_timeout_s:.0f} s); cluster resources: {ray.cluster_resources()}")

    def _new_actor(self, index: int):
        import ray

        from lean_rl.backends.sglang.engine_actor import EngineActor

        bundle = self._bundle() if self._placement is None else self._placement.resources[index]
        # max_concurrency: alive / log_tail answer while a start or restart waits for health.
        options: dict = {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0), "max_concurrency": 4}
        visible_devices = None
        if self._placement is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._placement.placement_group,
                placement_group_bundle_index=self._placement.bundle_indices[index])
            if self._placement.visible_devices:
                visible_devices = ",".join(self._placement.visible_devices[index])
        elif self.config.engine_nodes:
            options["resources"] = {f"node:{self.config.engine_nodes[index]}": 0.001}
        else:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group, placement_group_bundle_index=index)
        actor_cls = ray.remote(EngineActor).options(**options)
        return actor_cls.remote(self.config, index, str(self.engine_log_path(index)), on_cluster=True,
                                stop_timeout_s=self.stop_timeout_s, visible_devices=visible_devices)

    def _wait_actors_healthy(self, indices: list[int]) -> float:
        import ray

        t0 = time.monotonic()
        refs = [self._actors[i].wait_healthy.remote() for i in indices]
        try:
            ray.get(refs, timeout=self.config.start_timeout_s + 30)
        except ray.exceptions.RayTaskError as exc:
            raise EngineStartError(str(exc)) from None
        return time.monotonic() - t0

    def _restart_actor_engine(self, index: int) -> float:
        """Restart through the actor (same port); a dead actor (its node gone) is replaced by a new one,
        whose URL may differ: the group's and its config's URLs follow."""
        import ray

        try:
            return ray.get(self._actors[index].restart.remote(), timeout=self.config.start_timeout_s + 60)
        except ray.exceptions.RayActorError:
            url = self._urls[index] if index < len(self._urls) else "?"
            node = urllib.parse.urlsplit(url).hostname or "?"
            logger.warning("engine %d (%s) on node %s: its actor is gone%s; starting a new engine where Ray "
                           "places it (a new URL)", index, url, node,
                           " (node lost: Ray reports it dead)" if node in _dead_nodes() else "")
        except ray.exceptions.RayTaskError as exc:
            raise EngineStartError(str(exc)) from None
        self._kill_actor(self._actors[index])
        t0 = time.monotonic()
        self._actors[index] = self._new_actor(index)
        self._urls[index] = ray.get(self._actors[index].start.remote(), timeout=self.config.start_timeout_s)
        self._wait_actors_healthy([index])
        self._publish_urls()
        return time.monotonic() - t0

    def _kill_actor(self, actor) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _stop_actors(self) -> None:
        """Each actor stops its server (bounded), then the actors and the placement group go."""
        import ray

        actors, self._actors = self._actors, []
        refs = [actor.shutdown.remote() for actor in actors]
        try:
            ray.get(refs, timeout=self.stop_timeout_s + 15)
        except Exception as exc:  # noqa: BLE001 - killing the actor still takes its server down (PDEATHSIG)
            logger.warning("engine actors did not all stop their servers cleanly: %s", exc)
        for actor in actors:
            self._kill_actor(actor)
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._placement_group)
            except Exception:  # noqa: BLE001
                pass
            self._placement_group = None


def _dead_nodes() -> set[str]:
    """Addresses of the nodes Ray reports dead (and not alive again); empty when Ray cannot say."""
    import ray

    try:
        nodes = ray.nodes()
    except Exception:  # noqa: BLE001
        return set()
    alive = {n["NodeManagerAddress"] for n in nodes if n["Alive"]}
    return {n["NodeManagerAddress"] for n in nodes if not n["Alive"]} - alive
