"""Start, stop and restart a group of SGLang servers with sglang-router in front of them.

    with EngineGroup(config, run_dir) as engines:
        engines.router_url          # generation goes here
        engines.engine_urls         # weight updates, abort, pause/continue go to every engine

Every server is `python -m lean_rl.backends.sglang.launch <flags>` (CPU patches applied from argv)
on a 127.0.0.1 port; its log is run_dir/engine-<i>.log, the router's run_dir/router.log. Start-up is
parallel: the router starts while the servers import, and each server joins the router once healthy.
Children die with this process (see processes.py), so a crashed driver leaves no orphans.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.config import EngineConfig, flags_to_dict, resolve_ports
from lean_rl.backends.sglang.model_check import ModelDirInfo, check_model_dir
from lean_rl.backends.sglang.processes import ChildProcess, ChildStartError, stop_all, wait_until_healthy
from lean_rl.backends.sglang.router import RouterAdmin
from lean_rl.utils.net import find_free_port, require_free_port

logger = logging.getLogger(__name__)

# Failures after which an SGLang server hangs instead of exiting (uvicorn fails to bind, then the
# server waits forever in "Waiting for application shutdown"): detect them in the log.
SERVER_FATAL_LOG_LINES = {
    "error while attempting to bind on address": "cannot bind its port (another process took it)",
}


# <base>/lean_rl_sglang<i>_XXXXXXXX/tmpXXXXXXXX must stay under the 107-byte unix socket path limit.
_MAX_TMP_BASE_LEN = 70


class EngineStartError(ChildStartError):
    """A server or the router failed to start; the message holds the tail of its log."""


class EngineGroup:
    def __init__(self, config: EngineConfig, run_dir: str | Path, *, stop_timeout_s: float = 15.0):
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

    # ------------------------------------------------------------------ addresses
    @property
    def engine_urls(self) -> list[str]:
        return [self.engine_url(i) for i in range(len(self.engine_ports))]

    def engine_url(self, index: int) -> str:
        return f"http://{self.config.host}:{self.engine_ports[index]}"

    @property
    def router_url(self) -> str:
        if self.router_port is None:
            raise RuntimeError("EngineGroup is not started")
        return f"http://{self.config.host}:{self.router_port}"

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
        return {c.name: c.tree_pids() for c in children}

    def engine_log_path(self, index: int) -> Path:
        return self.run_dir / f"engine-{index}.log"

    def engine_alive(self, index: int) -> bool:
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
            stop_all(children, self.stop_timeout_s)
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
        metrics_port = find_free_port(self.config.host)
        while metrics_port in (*self.engine_ports, self.router_port):
            metrics_port = find_free_port(self.config.host)
        flags = self.config.router_flags(self.router_port, metrics_port)
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
