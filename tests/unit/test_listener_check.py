"""The run's key goes only to a listener that proves to be the run's (backends/sglang/listener_check.py).

Real sockets and processes on loopback: "ours" is a child started with the key in its environment, as
EngineConfig.server_env / router_env start a server and the router; a server of another run (another
key), a process of the test itself and a listener on the port a dead server freed are not. Each server
writes the Authorization header of every request it gets to a file: the effect checked is what
reached it, through lean_rl's own clients (EngineClient, RouterAdmin, EngineMonitor)."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.client_errors import EngineConnectionError, RetryPolicy
from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV
from lean_rl.backends.sglang.health import EngineMonitor
from lean_rl.backends.sglang.listener_check import ForeignListenerError, require_keyed_listener
from lean_rl.backends.sglang.router import RouterAdmin, RouterError
from lean_rl.utils.net import find_free_port

KEY = "listener-check-key-0123456789"
ANSWER = {"workers": [], "model_path": "/m", "weight_version": "3"}

# A server that answers every call with ANSWER and appends the Authorization header it got to a file.
RECORDING_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, log = int(sys.argv[1]), sys.argv[2]
class Handler(BaseHTTPRequestHandler):
    def _answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(log, "a") as f:
            f.write(json.dumps([self.path, self.headers.get("Authorization")]) + "\\n")
        body = json.dumps(%r).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_DELETE = _answer
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
""" % (ANSWER,)


class Recorder(BaseHTTPRequestHandler):
    """A listener of the test process itself (not started with the key): records what it gets."""

    seen: list = []

    def _answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append([self.path, self.headers.get("Authorization")])
        body = json.dumps(ANSWER).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args):
        pass


def start_server(tmp_path, key: str | None, port: int | None = None):
    """A recording server in a child process, `key` in its environment as a server of the run has it."""
    port = port or find_free_port("127.0.0.1")
    log = tmp_path / f"seen-{port}-{time.monotonic_ns()}.jsonl"
    log.touch()
    env = {k: v for k, v in os.environ.items() if k != CHILD_API_KEY_ENV}
    if key is not None:
        env[CHILD_API_KEY_ENV] = key
    proc = subprocess.Popen([sys.executable, "-c", RECORDING_SERVER, str(port), str(log)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False)
            break
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the recording server did not start")
            time.sleep(0.05)
    return SimpleNamespace(url=f"http://127.0.0.1:{port}", port=port, proc=proc,
                           seen=lambda: [json.loads(line) for line in log.read_text().splitlines()])


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(key, port=None):
        started.append(start_server(tmp_path, key, port))
        return started[-1]

    yield start
    for server in started:
        server.proc.kill()
        server.proc.wait()


def weight_version(url: str, key: str | None, attempts: int = 3) -> str:
    async def call():
        retry = RetryPolicy(attempts=attempts, initial_backoff_s=0.05, max_backoff_s=0.05)
        async with EngineClient(url, api_key=key, retry=retry) as client:
            return await client.weight_version()

    return asyncio.run(call())


def test_the_key_goes_to_a_server_started_with_it_and_not_without_one(servers):
    ours = servers(KEY)
    RouterAdmin(ours.url, api_key=KEY).workers()
    RouterAdmin(ours.url).workers()
    assert weight_version(ours.url, KEY) == "3" and weight_version(ours.url, None) == "3"
    assert [auth for _, auth in ours.seen() if _ != "/health"] == [f"Bearer {KEY}", None, f"Bearer {KEY}", None]


@pytest.mark.parametrize("whose", ["another run's (another key)", "no key in its environment"])
def test_a_server_that_was_not_given_the_key_never_receives_it(servers, whose):
    stranger = servers("another-runs-key" if whose.startswith("another") else None)
    with pytest.raises(RouterError, match="not by a server of this run"):
        RouterAdmin(stranger.url, api_key=KEY).workers()
    with pytest.raises(EngineConnectionError, match="not by a server of this run"):
        weight_version(stranger.url, KEY)
    assert all(auth is None for _, auth in stranger.seen())


def test_after_a_server_dies_a_listener_on_its_freed_port_never_receives_the_key(servers):
    ours = servers(KEY)
    assert weight_version(ours.url, KEY) == "3"  # verified once, remembered
    ours.proc.kill()
    ours.proc.wait()
    # nothing listens: a connection error, as for any dead server
    with pytest.raises(ForeignListenerError, match="nothing listens"):
        require_keyed_listener("127.0.0.1", ours.port, KEY)
    # the test process binds the freed port, as any other process could
    Recorder.seen = []
    squatter = ThreadingHTTPServer(("127.0.0.1", ours.port), Recorder)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EngineConnectionError, match="not by a server of this run"):
            weight_version(ours.url, KEY)  # retried, each try checked
        with pytest.raises(RouterError, match="not by a server of this run"):
            RouterAdmin(ours.url, api_key=KEY).workers()
        # the health monitor's polls send no key at all: the squatter answers them, learns nothing
        group = SimpleNamespace(config=SimpleNamespace(api_key=KEY), engine_urls=[ours.url], router_url=ours.url,
                                engine_url=lambda index: ours.url, engine_alive=lambda index: True,
                                router_alive=lambda: True)
        with EngineMonitor(group, interval_s=0.05):
            deadline = time.monotonic() + 10
            while not {"/health", "/liveness"} <= {path for path, _ in Recorder.seen} and time.monotonic() < deadline:
                time.sleep(0.05)
        assert {"/health", "/liveness"} <= {path for path, _ in Recorder.seen}, Recorder.seen
        assert all(auth is None for _, auth in Recorder.seen), Recorder.seen
    finally:
        squatter.shutdown()
        squatter.server_close()
    # our server back on its port (a restart): verified anew, the key flows again
    back = servers(KEY, port=ours.port)
    assert weight_version(back.url, KEY) == "3" and back.seen()[-1][1] == f"Bearer {KEY}"


def test_a_name_that_does_not_resolve_is_a_connection_error_not_a_key_sent():
    with pytest.raises(ForeignListenerError, match="cannot resolve"):
        require_keyed_listener("no-such-host.invalid", 80, KEY)


def test_an_address_of_no_node_of_the_run_is_not_sent_the_key():
    # neither this node's (no /proc to look into) nor a Ray node's (no agent to ask): nobody can verify it
    with pytest.raises(ForeignListenerError, match="neither this node nor a node of the run's Ray cluster"):
        require_keyed_listener("192.0.2.1", 80, KEY)  # TEST-NET-1 (RFC 5737)
