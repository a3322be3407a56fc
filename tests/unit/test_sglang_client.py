"""EngineClient's transport policy (retries, timeouts, error mapping, sync facade) against a throwaway
local HTTP server. What SGLang itself answers is tested against real servers in tests/integration."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.client_errors import (EngineConnectionError, EngineHTTPError, EngineTimeoutError,
                                                   RetryPolicy)
from lean_rl.utils.net import find_free_port

FAST_RETRY = RetryPolicy(attempts=4, initial_backoff_s=0.05, max_backoff_s=0.1)


class Handler(BaseHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):
        pass

    def _reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.do_POST()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        Handler.requests.append(self.path)
        if self.path == "/slow":
            time.sleep(1.0)
            self._reply(200, {})
        elif self.path == "/generate":
            ids = body["input_ids"]
            self._reply(200, {"output_ids": ids[::-1], "meta_info": {"finish_reason": {"type": "length", "length": 2},
                                                                    "weight_version": "w"}})
        elif self.path == "/update_weights_from_disk":
            self._reply(400, {"success": False, "message": f"cannot load {body['model_path']}"})
        elif self.path in ("/begin_weight_update", "/end_weight_update"):
            self._reply(200, {"success": True, "message": "ok"})
        elif self.path == "/update_weights_from_tensor":
            self._reply(200, {"success": False, "message": "shapes differ"})
        else:
            self._reply(404, {"message": f"no route {self.path}"})


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # like uvicorn's backlog; the default 5 resets concurrent connections

    def handle_error(self, request, client_address):
        pass  # e.g. /slow answering a client that timed out: expected here, not worth a traceback


def serve(port=0):
    server = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def server():
    Handler.requests = []
    srv = serve()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_retry_backoffs_grow_and_are_capped():
    assert list(RetryPolicy(attempts=5, initial_backoff_s=0.5, max_backoff_s=1.5, multiplier=2).backoffs()) == [
        0.5, 1.0, 1.5, 1.5]
    assert list(RetryPolicy(attempts=1).backoffs()) == []
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_connection_refused_is_retried_then_names_url_and_endpoint():
    url = f"http://127.0.0.1:{find_free_port()}"
    client = EngineClient(url, retry=FAST_RETRY)
    start = time.monotonic()
    with pytest.raises(EngineConnectionError, match=rf"{url}/flush_cache: cannot connect after 4 attempts"):
        asyncio.run(client.flush_cache())
    assert time.monotonic() - start >= 0.05 + 0.1 + 0.1  # it did back off between attempts


def test_a_server_that_comes_up_during_the_retries_is_reached():
    port = find_free_port()
    started = []
    timer = threading.Timer(0.3, lambda: started.append(serve(port)))
    timer.start()
    try:
        client = EngineClient(f"http://127.0.0.1:{port}", retry=RetryPolicy(attempts=10, initial_backoff_s=0.1,
                                                                            max_backoff_s=0.2))
        result = asyncio.run(client.generate([1, 2, 3]))
        assert result.output_ids == [3, 2, 1]
    finally:
        timer.join()
        for srv in started:
            srv.shutdown()
            srv.server_close()


def test_read_timeout_is_not_retried(server):
    client = EngineClient(server, retry=FAST_RETRY)
    with pytest.raises(EngineTimeoutError, match=r"/slow: no answer within 0.3 s"):
        asyncio.run(client.request("POST", "/slow", {}, timeout_s=0.3))
    assert Handler.requests == ["/slow"]


def test_http_errors_carry_status_and_server_message(server):
    client = EngineClient(server, retry=FAST_RETRY)
    with pytest.raises(EngineHTTPError, match=r"/update_weights_from_disk: HTTP 400: cannot load /nowhere") as info:
        asyncio.run(client.update_weights_from_disk("/nowhere"))
    assert info.value.status_code == 400 and info.value.server_message == "cannot load /nowhere"
    with pytest.raises(EngineHTTPError, match="HTTP 404: no route /nope"):
        asyncio.run(client.request("GET", "/nope"))


def test_failed_tensor_update_still_ends_the_weight_update_session(server):
    client = EngineClient(server, retry=FAST_RETRY)
    with pytest.raises(EngineHTTPError, match="shapes differ"):  # HTTP 200 with success: false
        asyncio.run(client.update_weights_from_tensor(["payload"], weight_version=3))
    assert Handler.requests == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]


def test_argument_errors_are_raised_before_any_request(server):
    client = EngineClient(server)
    with pytest.raises(ValueError, match="exactly one"):
        asyncio.run(client.abort_request())
    with pytest.raises(ValueError, match="mode must be one of"):
        asyncio.run(client.pause_generation("freeze"))
    with pytest.raises(ValueError, match="differ in length"):
        asyncio.run(client.update_weights_from_distributed(["a"], ["float32"], []))
    assert Handler.requests == []


def test_one_client_survives_several_event_loops(server):
    client = EngineClient(server)
    for _ in range(2):
        assert asyncio.run(client.generate([4, 5])).output_ids == [5, 4]


def test_concurrent_generate_on_one_client(server):
    async def many():
        async with EngineClient(server) as client:
            return await asyncio.gather(*(client.generate([i, i + 1]) for i in range(50)))

    results = asyncio.run(many())
    assert [r.output_ids for r in results] == [[i + 1, i] for i in range(50)]


def test_blocking_client_calls_and_submits(server):
    with BlockingEngineClient(server, retry=FAST_RETRY) as client:
        assert client.generate([1, 2]).output_ids == [2, 1]
        future = client.submit(EngineClient.generate, [7, 8, 9])
        assert future.result(timeout=10).output_ids == [9, 8, 7]
        with pytest.raises(EngineHTTPError, match="cannot load /x"):
            client.update_weights_from_disk("/x")
    with pytest.raises(RuntimeError, match="is closed"):
        client.generate([1])
