"""The run's API key on real services: the session's SGLang servers and sglang-router (conftest.py,
started with the key engine_config_for_tests chose) refuse calls without it and serve calls with it;
the key is on no command line and in no log. A second test runs the router alone in front of a fake
worker to see what it sends that worker."""

import asyncio
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psutil
import pytest

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.client_errors import EngineConnectionError, EngineHTTPError, RetryPolicy
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.backends.sglang.api_keys import API_KEY_ENV
from lean_rl.backends.sglang.processes import ChildProcess, wait_until_healthy
from lean_rl.backends.sglang.router import RouterAdmin, RouterError
from lean_rl.backends.sglang.server_command import router_command
from lean_rl.utils.net import find_free_port
from lean_rl.options import build

pytestmark = pytest.mark.integration

GENERATE = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}}
REFUSED = (401, 403)


def post(url: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url, json=body, headers=headers, timeout=60, trust_env=False)


def test_engines_and_router_refuse_calls_without_the_runs_key(engine_group):
    key = engine_group.config.api_key
    assert key, "the session's engines run with a generated key"
    engine, router = engine_group.engine_urls[0], engine_group.router_url

    for url in (engine, router):
        for wrong in (None, "not-the-key"):
            assert post(f"{url}/generate", GENERATE, wrong).status_code in REFUSED, url
        assert post(f"{url}/generate", GENERATE, key).status_code == 200, url
        # health checks (ours, the router's, k8s-style probes) need no key
        assert httpx.get(f"{url}/health", timeout=30, trust_env=False).status_code == 200

    # weight updates: refused without the key; with it the call gets past authentication to the body
    # check (no model_path: a validation error), so the served weights stay as they are
    assert post(f"{engine}/update_weights_from_disk", {"model_path": "/nowhere"}).status_code in REFUSED
    invalid = post(f"{engine}/update_weights_from_disk", {}, key)
    assert invalid.status_code in (400, 422) and "model_path" in invalid.text, invalid.text
    assert post(f"{engine}/flush_cache", {}).status_code in REFUSED

    # the router's worker API: listing and adding workers need the key (0.3.2 has no /add_worker)
    assert httpx.get(f"{router}/workers", timeout=30, trust_env=False).status_code in REFUSED
    assert post(f"{router}/workers", {"url": "http://127.0.0.1:9"}).status_code in REFUSED
    assert post(f"{router}/add_worker?url=http://127.0.0.1:9", {}).status_code in (*REFUSED, 404)
    assert engine_group.router.worker_urls() == set(engine_group.engine_urls)
    with pytest.raises(RouterError, match="HTTP 401"):
        RouterAdmin(router).workers()

    # lean_rl's clients: with the key they work, without it the server's 401 comes back as an error
    async def calls():
        async with EngineClient(engine) as anonymous:
            with pytest.raises(EngineHTTPError) as refused:
                await anonymous.model_info()
        async with engine_group.router_client() as through_router, engine_group.engine_clients()[0] as direct:
            result = await through_router.generate(GENERATE["input_ids"], GENERATE["sampling_params"])
            return refused.value.status_code, result, await direct.model_info()

    status, result, info = asyncio.run(calls())
    assert status == 401 and len(result.output_ids) == 2 and info["model_path"]


def test_the_key_is_on_no_command_line_and_in_no_log(engine_group):
    key = engine_group.config.api_key
    pids = [pid for tree in engine_group.pids().values() for pid in tree]
    assert len(pids) >= len(engine_group.engine_urls) + 1
    for pid in pids:
        try:
            assert key not in " ".join(psutil.Process(pid).cmdline()), pid
        except psutil.NoSuchProcess:
            pass
    # the engine actors (Ray workers) and every other Ray process have the key in no environment:
    # the actors read it from its file when their config arrives (run_key.py)
    actors = {psutil.Process(tree[0]).ppid() for name, tree in engine_group.pids().items() if name != "router"}
    rays = {p.pid for p in psutil.process_iter(["cmdline"]) if "ray" in " ".join(p.info["cmdline"] or [])}
    assert actors
    for pid in actors | rays:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                assert key.encode() not in f.read(), (pid, psutil.Process(pid).name())
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
            pass
    logs = [engine_group.engine_log_path(i) for i in range(len(engine_group.engine_urls))]
    logs.append(engine_group.run_dir / "router.log")
    for log in logs:
        text = log.read_text(errors="replace")
        assert "server_args=" in text or log.name == "router.log"  # SGLang logged its args, key redacted
        assert key not in text, log


class _FakeWorker(BaseHTTPRequestHandler):
    """An SGLang stand-in that records the Authorization header of every call."""

    seen: list[tuple[str, str | None]] = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/generate"):
            body = {"text": "x", "output_ids": [7], "meta_info": {"id": "1", "finish_reason": {"type": "length"}}}
        elif self.path.startswith("/server_info"):
            body = {"model_path": "/fake", "dp_size": 1, "tp_size": 1}
        else:
            body = {"model_path": "/fake", "is_generation": True}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def test_the_router_sends_the_key_to_its_workers(tmp_path):
    config = resolve_api_key(resolve_ports(build(EngineConfig, model_path="/fake", num_engines=1, device="cpu")), environ={})
    key, router_url = config.api_key, config.router_url
    worker = ThreadingHTTPServer(("127.0.0.1", find_free_port("127.0.0.1")), _FakeWorker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    worker_url = f"http://127.0.0.1:{worker.server_address[1]}"
    env = {**os.environ, "NO_COLOR": "1", **config.router_env()}
    router = ChildProcess("router", router_command(config, config.resolved_router_port, find_free_port("127.0.0.1")),
                          tmp_path / "router.log", env=env)
    try:
        wait_until_healthy([(router, f"{router_url}/health")], timeout_s=60)
        assert key not in " ".join(psutil.Process(router.pid).cmdline())
        assert post(f"{router_url}/workers", {"url": worker_url}).status_code == 401
        RouterAdmin(router_url, api_key=key).add_worker(worker_url, timeout_s=60)
        assert post(f"{router_url}/generate", GENERATE).status_code == 401
        assert post(f"{router_url}/generate", GENERATE, key).status_code == 200
        sent = dict(_FakeWorker.seen)  # the last call to each path
        # discovery when the worker is added, and what it forwards: all with the run's key
        assert sent["/server_info"] == sent["/model_info"] == sent["/generate"] == f"Bearer {key}", _FakeWorker.seen
        assert key not in (tmp_path / "router.log").read_text(errors="replace")
    finally:
        router.stop()
        worker.shutdown()


def test_after_the_router_dies_a_listener_on_its_port_never_gets_the_key(tmp_path, monkeypatch):
    """$LEAN_RL_API_KEY is read once: the router (which serves) gets the key under its own variable and
    never $LEAN_RL_API_KEY. The clients send the key to the router, verified as the run's; once it is
    gone, a listener of another process on its freed port gets retried calls, none with the key."""
    key = f"integration-{os.getpid()}-{find_free_port('127.0.0.1')}"
    monkeypatch.setenv(API_KEY_ENV, key)
    config = resolve_api_key(resolve_ports(build(EngineConfig, model_path="/fake", num_engines=1, device="cpu")))
    assert config.api_key == key and API_KEY_ENV not in os.environ
    port, router_url = config.resolved_router_port, config.router_url
    env = {**os.environ, "NO_COLOR": "1", **config.router_env()}
    router = ChildProcess("router", router_command(config, port, find_free_port("127.0.0.1")),
                          tmp_path / "router.log", env=env)
    admin = RouterAdmin(router_url, timeout_s=10, api_key=config.api_key)
    try:
        wait_until_healthy([(router, f"{router_url}/health")], timeout_s=60)
        with open(f"/proc/{router.pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        assert not [entry for entry in environ if entry.startswith(f"{API_KEY_ENV}=".encode())]
        assert admin.workers() == []  # the router proved to be the run's: the key went to it
    finally:
        router.stop()

    seen: list[tuple[str, str | None]] = []
    squatter = ThreadingHTTPServer(("127.0.0.1", port), type("Squatter", (_FakeWorker,), {"seen": seen}))
    threading.Thread(target=squatter.serve_forever, daemon=True).start()

    async def generate():
        retry = RetryPolicy(attempts=3, initial_backoff_s=0.1)
        async with EngineClient(router_url, api_key=config.api_key, retry=retry) as client:
            await client.generate(GENERATE["input_ids"], GENERATE["sampling_params"])

    try:
        with pytest.raises(RouterError, match="not by a server of this run"):
            admin.workers()
        with pytest.raises(EngineConnectionError, match="not by a server of this run"):
            asyncio.run(generate())
        assert httpx.get(f"{router_url}/liveness", timeout=10, trust_env=False).status_code == 200  # it answers
        assert all(auth is None or key not in auth for _, auth in seen), seen
    finally:
        squatter.shutdown()
        squatter.server_close()
