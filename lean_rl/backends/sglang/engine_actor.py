"""One SGLang server owned by a Ray actor on the node it runs on.

EngineGroup makes this plain class a Ray actor, one per engine, placed by engine_placement.py, on one
node as on a cluster. The actor:

- binds its server to `--sglang-host` (loopback by default) on one node; on a cluster
  (`config.on_cluster`, --ray-address) to its node's Ray address (`service_host`), never 0.0.0.0;
- listens on the port the run chose (`config.engine_ports`, one node), or --sglang-base-port + index,
  or a port free *on its node* (a cluster);
- starts the server as `python -m lean_rl.backends.sglang.launch <flags>` (processes.ChildProcess: env,
  log file, own session, PDEATHSIG) from one spawner thread that lives as long as the actor, so the
  server dies with the actor's process (and the actor with the driver that owns it);
- answers url / alive / health wait / log tail / pids, restarts its server on the same port, and
  stops it (bounded: SIGTERM, wait, SIGKILL); its server's private TMPDIR goes with it.

Errors come back as EngineActorStartError raised in the actor; Ray re-raises them in the caller wrapped
in a RayTaskError whose message holds the original one (with the log tail).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import sys
import tempfile
from pathlib import Path

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV
from lean_rl.backends.sglang.command_line import merge_flags, flags_to_dict
from lean_rl.backends.sglang.processes import ChildProcess, ChildStartError, stop_all, wait_until_healthy
from lean_rl.backends.sglang.server_command import server_flags
from lean_rl.utils.coverage_data import save_coverage_data
from lean_rl.utils.net import find_free_port, require_free_port, service_host, socket_interface_env

# Failures after which an SGLang server hangs instead of exiting (uvicorn fails to bind, then the
# server waits forever in "Waiting for application shutdown"): detect them in the log.
SERVER_FATAL_LOG_LINES = {
    "error while attempting to bind on address": "cannot bind its port (another process took it)",
}
# <base>/lean_rl_sglang<i>_XXXXXXXX/tmpXXXXXXXX must stay under the 107-byte unix socket path limit.
_MAX_TMP_BASE_LEN = 70


# SGLang answers SIGTERM by draining requests, but its watchdog looks at the flag only every 5 s
# (sglang/srt/managers/tokenizer_manager.py:3508-3510, sigterm_watchdog), so an idle server took ~5 s
# to go (measured: 5.8 s for two). We stop a server only once nothing is in flight for it (the run
# ended, or the engine is being restarted and was taken out of the router), and it keeps no state
# to flush: a short grace lets its daemons unlink their shared memory (engine.py:870), then SIGKILL.
SERVER_STOP_GRACE_S = 1.0

class EngineActorStartError(RuntimeError):
    """The server failed to start or become healthy; the message holds the tail of its log."""


class EngineActor:
    def __init__(self, config: EngineConfig, index: int, log_path: str, *, stop_timeout_s: float = 15.0,
                 visible_devices: str | None = None):
        self.config = config
        self.index = index
        self.log_path = Path(log_path)
        self.stop_timeout_s = stop_timeout_s
        # colocated on GPU: the devices the server uses (the trainer ranks' it shares), not Ray's pick
        self.visible_devices = visible_devices
        self.host = service_host(True) if config.on_cluster else config.host
        if config.engine_ports and not config.on_cluster:
            self.port = config.engine_ports[index]  # chosen by the run (resolve_ports), checked by EngineGroup
        elif config.base_port is not None:
            self.port = config.base_port + index
            require_free_port(self.port, "--sglang-base-port", self.host)
        else:
            self.port = find_free_port(self.host)
        self._server: ChildProcess | None = None
        self._tmp_dir: str | None = None
        # The server dies with the thread that forked it (PDEATHSIG): fork from one thread that lives
        # exactly as long as this actor, not from Ray's task threads.
        self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lean_rl-engine")

    # ------------------------------------------------------------------ facts
    @property
    def _url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self) -> str:
        return self._url

    def node_ip(self) -> str:
        return self.host

    def server_pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    def tree_pids(self) -> list[int]:
        return [] if self._server is None else self._server.tree_pids()

    def alive(self) -> bool:
        return self._server is not None and self._server.alive()

    def log_tail(self, lines: int = 40) -> str:
        return "" if self._server is None else self._server.log_tail(lines)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Start the server (does not wait for it); returns its URL."""
        if self._server is not None and self._server.alive():
            raise RuntimeError(f"engine {self.index}: already running at {self._url}")
        self._server = self._spawner.submit(self._spawn).result()
        return self._url

    def wait_healthy(self, timeout_s: float | None = None) -> float:
        """Seconds until /health answered 200; raises EngineActorStartError with the log tail."""
        try:
            return wait_until_healthy([(self._server, f"{self._url}/health")],
                                      self.config.start_timeout_s if timeout_s is None else timeout_s,
                                      fatal_log_lines=SERVER_FATAL_LOG_LINES)
        except ChildStartError as exc:
            raise EngineActorStartError(f"SGLang server {self.index} at {self._url} failed to start: {exc}") from None

    def restart(self) -> float:
        """Stop the server, start it again on the same port, wait until healthy; returns the seconds."""
        self.stop_server()
        require_free_port(self.port, f"engine {self.index} restart", self.host)
        self.start()
        return self.wait_healthy()

    def stop_server(self) -> None:
        """Stop the server tree (SIGTERM, wait at most SERVER_STOP_GRACE_S, SIGKILL). Safe to call twice."""
        server, self._server = self._server, None
        try:
            if server is not None:
                stop_all([server], min(self.stop_timeout_s, SERVER_STOP_GRACE_S))
        finally:
            if self._tmp_dir is not None:
                shutil.rmtree(self._tmp_dir, ignore_errors=True)
                self._tmp_dir = None

    def shutdown(self) -> None:
        """Stop the server and the spawner thread; the actor can then be killed."""
        try:
            self.stop_server()
        finally:
            self._spawner.shutdown(wait=True)
            save_coverage_data()  # the actor is killed next (SIGKILL); under scripts/cpu_coverage.py

    # ------------------------------------------------------------------ internals
    def _server_flags(self) -> list[str]:
        flags = flags_to_dict(server_flags(self.config, self.index, self.port))
        flags["--host"] = [self.host]
        if self.config.device != "cpu" and "--base-gpu-id" in flags:
            # Ray gives the actor its GPUs as CUDA_VISIBLE_DEVICES: they are 0..tp-1 in here.
            flags["--base-gpu-id"] = ["0"]
        return merge_flags(flags, {})

    def _network_env(self) -> dict[str, str]:
        """On a cluster: gloo and NCCL in the server (weight-update groups with the trainer) on the
        interface of the address this engine binds, as the trainer ranks do (utils/net.py)."""
        return socket_interface_env(self.host, os.environ) if self.config.on_cluster else {}

    def launch_plan(self) -> dict:
        """What _spawn runs: the server's command line and the environment it adds to the actor's own
        (CUDA_VISIBLE_DEVICES: the colocated devices, else the GPUs Ray gave this actor), without the
        API key. Starts nothing: the placement tests read it on machines without GPUs."""
        env = {**self.config.server_env(), **self._network_env()}
        env.pop(CHILD_API_KEY_ENV, None)
        visible = self.visible_devices if self.visible_devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        return {"cmd": [sys.executable, "-m", "lean_rl.backends.sglang.launch", *self._server_flags()], "env": env}

    def _spawn(self) -> ChildProcess:
        cmd = [sys.executable, "-m", "lean_rl.backends.sglang.launch", *self._server_flags()]
        # SGLang names its ZMQ ipc sockets with tempfile.NamedTemporaryFile(delete=False) and never
        # removes them (sglang/srt/server_args.py PortArgs.init_new): a private TMPDIR that
        # stop_server() deletes, next to the log (so even a killed driver leaves nothing in /tmp)
        # unless that path is too long for an ipc socket path (at most 107 bytes).
        base = self.log_path.parent
        base.mkdir(parents=True, exist_ok=True)
        self._tmp_dir = tempfile.mkdtemp(prefix=f"lean_rl_sglang{self.index}_",
                                         dir=base if len(str(base.resolve())) <= _MAX_TMP_BASE_LEN else None)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", **self.config.server_env(),
               **self._network_env(), "TMPDIR": self._tmp_dir}
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return ChildProcess(f"engine-{self.index}", cmd, self.log_path, env=env)
