"""EngineMonitor (backends/sglang/health.py) runs each engine's restart and rejoin on a thread of its
own: an engine whose rejoin hangs (its weight sync waits on the trainer) does not keep the monitor from
restarting another engine and putting it back. The engine group is a stand-in with processes that die
on request (the real group's restarts are tested in tests/integration/test_sglang_engines.py); the
monitor, its thread and its HTTP checks (against a loopback server) are the real ones."""

import http.server
import threading
import time
from types import SimpleNamespace

import pytest

from lean_rl.backends.sglang.health import EngineMonitor


class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # /health of an engine, /liveness of the router
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class DyingEngines:
    """Two engines whose processes die when told; a restart takes `restart_s`."""

    def __init__(self, url: str, restart_s: float = 0.2):
        self.config = SimpleNamespace(api_key=None)
        self.engine_urls, self.router_url = [url, url], url
        self.alive, self.routed = [True, True], {0, 1}
        self.restart_s = restart_s

    def engine_alive(self, index):
        return self.alive[index]

    def router_alive(self):
        return True

    def engine_url(self, index):
        return self.engine_urls[index]

    def engine_log_path(self, index):
        return f"engine-{index}.log"

    def restart_engine(self, index, add_back):
        self.routed.discard(index)
        time.sleep(self.restart_s)
        self.alive[index] = True
        return self.restart_s

    def add_engine(self, index):
        self.routed.add(index)

    def remove_engine(self, index):
        self.routed.discard(index)


def wait_until(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_hanging_rejoin_holds_neither_the_monitor_nor_another_engines_restart(server_url):
    engines = DyingEngines(server_url)
    release = threading.Event()
    rejoined = []

    def rejoin(index):  # EngineWeights.rejoin: engine 0's weight sync hangs until released
        if index == 0:
            release.wait(30)
        rejoined.append(index)

    monitor = EngineMonitor(engines, interval_s=0.1)
    monitor.rejoin = rejoin
    monitor.start()
    try:
        engines.alive[0] = False
        assert wait_until(lambda: monitor.health[0].awaiting_weights)  # restarted, its rejoin now hangs
        engines.alive[1] = False
        assert wait_until(lambda: 1 in rejoined and 1 in engines.routed)  # restarted and back meanwhile
        assert monitor.health[0].awaiting_weights and 0 not in engines.routed and rejoined == [1]
        release.set()
        assert wait_until(lambda: 0 in engines.routed)
        assert monitor.total_restarts == 2
    finally:
        release.set()
        monitor.stop(timeout_s=10)
