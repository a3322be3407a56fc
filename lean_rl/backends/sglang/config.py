"""Engine configuration: the `--rollout-*` / `--sglang-*` / `--router-*` flags, parsed once into a frozen
dataclass that knows the exact command-line flags of every SGLang server and of sglang-router.

    parser = argparse.ArgumentParser(allow_abbrev=False)   # abbreviations would swallow passthrough flags
    add_options(parser, EngineConfig, "rollout engines (SGLang + sglang-router)")
    args, unknown = parser.parse_known_args(argv)
    passthrough = split_passthrough(unknown)               # --sglang-<flag> / --router-<flag> -> the servers
    config = read_options(EngineConfig, args, device=detect_device(), server_passthrough=passthrough.server,
                          router_passthrough=passthrough.router)   # passthrough.rest: for the caller to reject
    config = resolve_api_key(resolve_ports(config))        # the ports and the API key, chosen once

A declared `--sglang-*` flag (e.g. `--sglang-host`, `--sglang-api-key`) is parsed by argparse and so
never reaches the passthrough. The command lines' tables and the passthrough: command_line.py; each
server's and the router's command line: server_command.py; the URLs they report once they run:
live_endpoints.py; the key: api_keys.py; resolve_ports and resolve_api_key: ports_and_key.py.

Authentication: every server and the router require `Authorization: Bearer <key>` (SGLang's and
sglang-router's own `api_key`), with one key per run: --sglang-api-key, else $LEAN_RL_API_KEY, else a
random one chosen by resolve_api_key; `--sglang-api-key none` turns it off. The key never appears on
a command line (other local users can read /proc/PID/cmdline): the children get it in their
environment (`server_env()` / `router_env()`, read by launch.py / launch_router.py), and clients take
it explicitly (`EngineClient(url, api_key=config.api_key)`), which send it only to a listener that
proves to be the run's (listener_check.py). $LEAN_RL_API_KEY is read once and removed from the
environment; the key travels to Ray actors as the path of its private file (run_key.py).

The device is chosen at run time: CPU flags when torch sees no CUDA device, SGLang's GPU defaults
otherwise. A user's `--sglang-<flag>` replaces our default for `--<flag>`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from lean_rl.backends.sglang.api_keys import (API_KEY_ENV, API_KEY_OFF, CHILD_API_KEY_ENV, api_key_value, auth_headers,
                                              travels_by_file)
from lean_rl.backends.sglang.command_line import (COLOCATED_GPU_ENV, MANAGED_ROUTER_FLAGS, MANAGED_SERVER_FLAGS,
                                                  flags_to_dict)
from lean_rl.backends.sglang.live_endpoints import LiveEndpoints
from lean_rl.backends.sglang.lora import ServedAdapter
from lean_rl.options import ConfigError, option

DEFAULT_HOST = "127.0.0.1"
# On CPU SGLang sizes the KV pool at ~70% of RAM unless told otherwise; this many tokens is plenty
# for the tiny and small models and takes a few MB.
DEFAULT_CPU_MAX_TOTAL_TOKENS = 16384
# --engine-start-timeout by device. On GPU a server's first start on a machine JIT-compiles
# flashinfer_python's kernels (a pure-Python wheel: no cubins pinned) and captures CUDA graphs, which
# can pass 300 s (review 2026-12-06 N7); later starts hit the JIT cache.
DEFAULT_CPU_START_TIMEOUT_S = 300.0
DEFAULT_GPU_START_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class EngineConfig:
    # The user's flags (--help order). num_engines and gpus_per_engine are final after derive_fields:
    # on GPU num_engines follows --rollout-num-gpus / --rollout-num-gpus-per-engine; on CPU
    # gpus_per_engine is 0.
    model_path: str | None = option(None, flag="--hf-checkpoint",
                                    help="HF checkpoint directory the SGLang engines serve")
    num_engines: int | None = option(None, flag="--rollout-num-engines",
                                     help="number of SGLang servers (CPU: one process each; GPU: derived from "
                                          "the two flags below)")
    num_gpus: int | None = option(None, flag="--rollout-num-gpus", help="GPUs for rollout in total (GPU only)")
    gpus_per_engine: int = option(1, flag="--rollout-num-gpus-per-engine", help="tensor-parallel size of one engine")
    host: str = option(DEFAULT_HOST, flag="--sglang-host",
                       help="address the servers and the router bind (one node; with --ray-address each "
                            "binds the Ray address of the node it runs on)")
    # None until resolve_api_key; NO_API_KEY ("") when authentication is off. Kept out of the repr.
    api_key: str | None = option(None, flag="--sglang-api-key", metavar="KEY", secret=True,
                                 convert=lambda value: api_key_value(value, "--sglang-api-key"),
                                 help=f"key every SGLang server and the router require (Authorization: Bearer "
                                      f"KEY); default --sglang-api-key-file, else ${API_KEY_ENV}, else a random "
                                      f"key per run; '{API_KEY_OFF}': no authentication. A key typed here shows in "
                                      "`ps` and Ray's job table: prefer the file or the variable")
    api_key_file: str | None = option(None, flag="--sglang-api-key-file", metavar="FILE", help=(
        "read the API key from this file (its first line; the documented way, with "
        f"${API_KEY_ENV}: neither shows in `ps`); mode 0600 or stricter, else refused; on a cluster, a "
        "path every node can read"))
    base_port: int | None = option(None, flag="--sglang-base-port",
                                   help="engine i listens on this + i (default: free ports)")
    router_port: int | None = option(None, flag="--router-port", help="sglang-router port (default: a free port)")
    mem_fraction_static: float | None = option(None, flag="--sglang-mem-fraction-static",
                                               help="GPU memory fraction for weights + KV")
    max_total_tokens: int | None = option(None, flag="--sglang-max-total-tokens",
                                          help=f"KV-cache size in tokens (CPU default {DEFAULT_CPU_MAX_TOTAL_TOKENS})")
    start_timeout_s: float = option(  # None: derive_fields picks the device's default
        None, flag="--engine-start-timeout",
        help=f"seconds until every server is healthy (default {DEFAULT_CPU_START_TIMEOUT_S:.0f} on CPU, "
             f"{DEFAULT_GPU_START_TIMEOUT_S:.0f} on GPU: a cold first start compiles FlashInfer's kernels and "
             "captures CUDA graphs)")
    request_timeout_s: float = option(600.0, flag="--engine-request-timeout",
                                      help="seconds for one HTTP call to an engine")
    cpu_threads: int | None = option(None, flag="--engine-cpu-threads",
                                     help="CPU: compute threads per engine (default: cores // (engines + 1), "
                                          "at least 1; engines: the student's and the --use-opd teacher's)")

    # Derived, given by the caller (config.parse_config): the device ("cpu" or "cuda", the trainer's),
    # the --sglang-<flag> / --router-<flag> passthrough, and the ports from resolve_ports.
    device: str = field(kw_only=True)
    server_passthrough: tuple[str, ...] = field(default=(), kw_only=True)
    router_passthrough: tuple[str, ...] = field(default=(), kw_only=True)
    # The ports every process will use, fixed before the engines start so that rollout code can reach
    # the router and engines through the config. Empty / None until resolve_ports.
    engine_ports: tuple[int, ...] = field(default=(), kw_only=True)
    resolved_router_port: int | None = field(default=None, kw_only=True)
    # CPU: each server's torch/OpenMP threads. SGLang takes every core by default, so N engines beside a
    # trainer oversubscribe the cores, and OpenMP's spin-waiting threads then slow decoding ~100x
    # (measured: 2 engines on 2 cores, ~900 -> ~10 tok/s). Default: an equal share of the cores with
    # one share left for the trainer and driver.
    threads_per_cpu_engine: int = field(default=0, kw_only=True)
    # The dtype the servers compute in (--dtype): the trainer's (MegatronConfig.params_dtype), so that
    # the probe compares like with like, unless --sglang-dtype says otherwise (config.parse_config).
    dtype: str = field(default="float32", kw_only=True)
    # --colocate: the servers share the trainer's devices; on GPU they release their memory while it
    # trains (server_flags / server_env add what SGLang needs for that)
    colocated: bool = field(default=False, kw_only=True)
    # servers of other engine groups on the same cores (the --use-opd teacher's): they share the split
    other_cpu_engines: int = field(default=0, kw_only=True)
    # --use-rollout-routing-replay (config.parse_config): the servers record every token's experts
    # (--enable-return-routed-experts) and every /generate asks for them (rollout/default.py)
    return_routed_experts: bool = field(default=False, kw_only=True)
    # --lora-sync adapter (config.parse_config): the servers serve the base with this LoRA adapter
    # (lora.py), which every request names; syncs load only its tensors
    adapter: ServedAdapter | None = field(default=None, kw_only=True)
    # Multi-node (--ray-address): every engine is a Ray actor (engine_actor.py) that binds its node's
    # Ray address on a port free there, and the router binds the driver's; the ports above are then
    # not used. engine_nodes pins engine i to the Ray node at that IP (tests) instead of a SPREAD
    # placement group. Once the group runs, it publishes the URLs its engines reported in `live`
    # (EngineGroup), and engine_urls / router_url return those.
    on_cluster: bool = field(default=False, kw_only=True)
    engine_nodes: tuple[str, ...] = field(default=(), kw_only=True)
    live: LiveEndpoints = field(default_factory=LiveEndpoints, kw_only=True, compare=False, repr=False)

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        """No GPU per engine on CPU; the engine count from the GPU counts; a CPU server's threads, an
        equal share of the cores beside the other servers and the trainer (options.build runs it)."""
        v = dict(values)
        if v["device"] == "cpu":
            v["gpus_per_engine"] = 0
        if v["start_timeout_s"] is None:
            v["start_timeout_s"] = DEFAULT_GPU_START_TIMEOUT_S if v["device"] == "cuda" else DEFAULT_CPU_START_TIMEOUT_S
        v["num_engines"] = _num_engines(v["num_engines"], v["num_gpus"], v["gpus_per_engine"], v["device"])
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        v["threads_per_cpu_engine"] = v["cpu_threads"] or max(1, cores // (v["num_engines"] + v["other_cpu_engines"] + 1))
        return v

    def __post_init__(self):
        validate_engine_config(self)

    def __getstate__(self) -> dict[str, Any]:
        # A Ray actor's argument (EngineActor) and anything else pickled carries the key's file, never
        # the key (run_key.py): a key that has no file yet (not from resolve_api_key) does not travel.
        if not travels_by_file(self.api_key):
            raise ConfigError("EngineConfig: its API key travels only as the path of its file; "
                              "choose the key with resolve_api_key(config) before sending the config")
        return dict(self.__dict__)

    @property
    def adapter_name(self) -> str | None:
        """What every request names as its lora_path (None: the engines serve plain weights)."""
        return self.adapter.name if self.adapter is not None else None

    @property
    def ports_resolved(self) -> bool:
        return self.resolved_router_port is not None

    @property
    def router_url(self) -> str:
        if self.live.router_url is not None:
            return self.live.router_url
        self._require_ports()
        return f"http://{self.host}:{self.resolved_router_port}"

    @property
    def engine_urls(self) -> tuple[str, ...]:
        if self.live.engine_urls:
            return self.live.engine_urls
        self._require_ports()
        return tuple(f"http://{self.host}:{port}" for port in self.engine_ports)

    def _require_ports(self) -> None:
        if not self.ports_resolved:
            raise ConfigError("the engine ports are not chosen yet: use resolve_ports(config)")

    @property
    def api_key_resolved(self) -> bool:
        return self.api_key is not None

    def _require_api_key(self) -> str:
        if self.api_key is None:
            raise ConfigError("the API key is not chosen yet: use resolve_api_key(config)")
        return self.api_key

    def auth_headers(self) -> dict[str, str]:
        """The HTTP headers every call to a server or the router carries ({} with authentication off).
        Unchecked: lean_rl's clients send the key through listener_check.bearer_auth, which first
        verifies the listener; these are for tests and benchmarks against servers they just started."""
        return auth_headers(self._require_api_key())

    def _child_key_env(self) -> dict[str, str]:
        key = self._require_api_key()
        return {CHILD_API_KEY_ENV: key} if key else {}

    @property
    def releases_memory(self) -> bool:
        """Colocated on GPU: the servers give their memory to the trainer while it trains."""
        return self.colocated and self.device == "cuda"

    def server_env(self) -> dict[str, str]:
        """Environment each server needs beyond the parent's: OpenMP and torch read their thread
        count only from there; launch.py reads the API key from there (never from argv); SGLang reads
        the switches of a server that releases its memory (COLOCATED_GPU_ENV) only from there."""
        env = {"OMP_NUM_THREADS": str(self.threads_per_cpu_engine)} if self.device == "cpu" else {}
        if self.releases_memory:
            env.update(COLOCATED_GPU_ENV)
        return {**env, **self._child_key_env()}

    def router_env(self) -> dict[str, str]:
        """Environment the router needs beyond the parent's: the API key, for launch_router.py."""
        return self._child_key_env()

def validate_engine_config(config: EngineConfig) -> None:
    def fail(flag: str, message: str):
        raise ConfigError(f"{flag}: {message}")

    if not config.model_path:
        fail("--hf-checkpoint", "is required (the HF checkpoint directory the engines serve)")
    if config.num_engines < 1:
        fail("--rollout-num-engines", f"must be >= 1, got {config.num_engines}")
    if config.host in ("0.0.0.0", "::", ""):
        fail("--sglang-host", f"{config.host!r} would expose the servers on every interface; give this node's "
                              "address (with --ray-address each engine binds its own node's address anyway)")
    if config.base_port is not None and not 1024 <= config.base_port <= 65535 - config.num_engines + 1:
        fail("--sglang-base-port", f"{config.base_port} leaves no room for {config.num_engines} ports in 1024..65535")
    if config.router_port is not None:
        if not 1024 <= config.router_port <= 65535:
            fail("--router-port", f"must be in 1024..65535, got {config.router_port}")
        if config.base_port is not None and config.base_port <= config.router_port < config.base_port + config.num_engines:
            fail("--router-port", f"{config.router_port} collides with the engine ports starting at --sglang-base-port")
    if config.mem_fraction_static is not None and not 0.0 < config.mem_fraction_static < 1.0:
        fail("--sglang-mem-fraction-static", f"must be in (0, 1), got {config.mem_fraction_static}")
    if config.max_total_tokens is not None and config.max_total_tokens < 1:
        fail("--sglang-max-total-tokens", f"must be >= 1, got {config.max_total_tokens}")
    if config.start_timeout_s <= 0:
        fail("--engine-start-timeout", f"must be > 0 seconds, got {config.start_timeout_s}")
    if config.request_timeout_s <= 0:
        fail("--engine-request-timeout", f"must be > 0 seconds, got {config.request_timeout_s}")
    if config.cpu_threads is not None and config.cpu_threads < 1:
        fail("--engine-cpu-threads", f"must be >= 1, got {config.cpu_threads}")
    if config.api_key:
        api_key_value(config.api_key, "--sglang-api-key")
        server = flags_to_dict(config.server_passthrough)
        # SGLang 0.5.23 enforces the key in single-tokenizer mode only (http_server.py asserts it is
        # unset otherwise), and its gRPC listener bypasses the key (serving_hook.py refuses both).
        workers = (server.get("--tokenizer-worker-num") or ["1"])[0]
        if not workers.isdigit() or int(workers) > 1:
            fail("--sglang-tokenizer-worker-num", f"SGLang checks API keys with one tokenizer worker only; "
                                                  f"use 1 or --sglang-api-key {API_KEY_OFF}")
        if "--grpc-port" in server:
            fail("--sglang-grpc-port", f"SGLang's gRPC listener does not check API keys; "
                                       f"use --sglang-api-key {API_KEY_OFF} to serve gRPC")
    if config.engine_nodes and len(config.engine_nodes) != config.num_engines:
        fail("engine nodes", f"{len(config.engine_nodes)} nodes for {config.num_engines} engines")
    if config.engine_nodes and not config.on_cluster:
        fail("engine nodes", "pinning engines to nodes needs a cluster (--ray-address)")
    if config.ports_resolved != bool(config.engine_ports) or len(config.engine_ports) not in (0, config.num_engines):
        fail("engine ports", f"{len(config.engine_ports)} engine ports and router port {config.resolved_router_port} "
                             f"for {config.num_engines} engines (use resolve_ports)")
    for prefix, flags, managed in (
        ("--sglang-", config.server_passthrough, MANAGED_SERVER_FLAGS),
        ("--router-", config.router_passthrough, MANAGED_ROUTER_FLAGS),
    ):
        for name in flags_to_dict(flags):
            if name[2:] in managed:
                fail(prefix + name[2:], f"is set by lean_rl; use {managed[name[2:]]}")


def _num_engines(given: int | None, gpus: int | None, per_engine: int, device: str) -> int:
    """The number of engines: --rollout-num-engines on CPU, else derived from the GPU counts."""
    if device == "cpu":
        return 1 if given is None else given
    if device != "cuda":
        raise ConfigError(f"device: must be 'cpu' or 'cuda', got {device!r}")
    if per_engine is None or per_engine < 1:
        raise ConfigError(f"--rollout-num-gpus-per-engine: must be >= 1, got {per_engine}")
    if gpus is None:
        return 1 if given is None else given
    if gpus % per_engine:
        raise ConfigError(f"--rollout-num-gpus: {gpus} is not a multiple of --rollout-num-gpus-per-engine {per_engine}")
    derived = gpus // per_engine
    if given is not None and given != derived:
        raise ConfigError(f"--rollout-num-engines: {given} disagrees with --rollout-num-gpus "
                          f"{gpus} / --rollout-num-gpus-per-engine {per_engine} = {derived}")
    return derived


