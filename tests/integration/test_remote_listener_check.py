"""The run's key goes only to a listener on another node that that node's ListenerAgent verified as the
run's (listener_agent.py), on a real Ray cluster of loopback nodes: "ours" is a process on 127.0.0.3
started with the key in its environment, as a server of the run is; after it dies, a process without
the key binds its freed port. Each writes the Authorization header of every request it gets to a
file: the effect checked is what reached it through lean_rl's own clients (EngineClient, async;
RouterAdmin, sync; EngineMonitor's polls), from a driver on another node of the cluster. The driver
does not look into 127.0.0.3's /proc itself (on loopback it could; on a real cluster it cannot): what
keeps the key home is the agent's answer alone (before it, listener_check.py at 8b2f022 sent the key
to any listener at another node's address)."""

import textwrap

import pytest

from lean_rl.testing.driver_result import run_driver

pytestmark = pytest.mark.integration

_DRIVER = textwrap.dedent("""
    import asyncio, json, os, subprocess, sys, tempfile, time
    from types import SimpleNamespace
    import httpx, ray
    from lean_rl.testing.driver_result import write_result
    from lean_rl.utils.ray_utils import init_ray
    from lean_rl.utils.net import find_free_port
    from lean_rl.backends.sglang import listener_agent, listener_check
    from lean_rl.backends.sglang.client import EngineClient
    from lean_rl.backends.sglang.client_errors import EngineConnectionError, RetryPolicy
    from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV
    from lean_rl.backends.sglang.health import EngineMonitor
    from lean_rl.backends.sglang.listener_check import ForeignListenerError, require_keyed_listener
    from lean_rl.backends.sglang.router import RouterAdmin, RouterError
    from lean_rl.backends.sglang.run_key import write_key_file

    SERVER = '''
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    host, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with open(log, "a") as f:
                f.write(json.dumps([self.path, self.headers.get("Authorization")]) + "\\\\n")
            body = json.dumps({"workers": [], "weight_version": "3"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_GET = do_POST = _answer
        def log_message(self, *args):
            pass
    ThreadingHTTPServer((host, port), Handler).serve_forever()
    '''

    init_ray(sys.argv[1])
    key = write_key_file("remote-listener-key-0123456789")
    here = ray.util.get_node_ip_address()
    ip = "127.0.0.3" if here != "127.0.0.3" else "127.0.0.4"
    node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip)
    port = find_free_port(ip)
    url = f"http://{ip}:{port}"
    logs = tempfile.mkdtemp()

    def start(with_key):
        env = {k: v for k, v in os.environ.items() if k != CHILD_API_KEY_ENV}
        if with_key:
            env[CHILD_API_KEY_ENV] = str(key)
        log = os.path.join(logs, f"seen-{time.monotonic_ns()}")
        open(log, "w").close()
        proc = subprocess.Popen([sys.executable, "-c", SERVER, ip, str(port), log], env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/health", timeout=2, trust_env=False)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the recording server did not start"
                time.sleep(0.05)
        return proc, lambda: [json.loads(line) for line in open(log)]

    def weight_version():
        async def call():
            retry = RetryPolicy(attempts=3, initial_backoff_s=0.05, max_backoff_s=0.05)
            async with EngineClient(url, api_key=key, retry=retry) as client:
                return await client.weight_version()
        return asyncio.run(call())

    def failure(call):
        try:
            call()
        except (ForeignListenerError, EngineConnectionError, RouterError) as exc:
            return str(exc)
        return None

    # as on a real cluster, this node cannot look into the other node's /proc: only its agent can
    real_is_local = listener_check.is_local
    listener_check.is_local = lambda address: address != ip and real_is_local(address)
    listener_agent.start_agents(key, [node])  # as EngineGroup.start does for its engines' nodes
    ours, ours_seen = start(with_key=True)
    answers = [weight_version(), RouterAdmin(url, api_key=key).workers()]
    started = time.perf_counter()
    for _ in range(20):
        require_keyed_listener(ip, port, key)
    check_ms = (time.perf_counter() - started) / 20 * 1000
    ours.kill()
    ours.wait()
    gone = failure(lambda: require_keyed_listener(ip, port, key))
    squatter, squatter_seen = start(with_key=False)  # binds the freed port, as any process could
    refused = [failure(weight_version), failure(lambda: RouterAdmin(url, api_key=key).workers())]
    group = SimpleNamespace(config=SimpleNamespace(api_key=key), engine_urls=[url], router_url=url,
                            engine_url=lambda index: url, engine_alive=lambda index: True, router_alive=lambda: True)
    with EngineMonitor(group, interval_s=0.05):
        deadline = time.monotonic() + 15
        while not {"/health", "/liveness"} <= {p for p, _ in squatter_seen()} and time.monotonic() < deadline:
            time.sleep(0.05)
    squatter.kill()
    squatter.wait()
    back, back_seen = start(with_key=True)  # our server again on its port (a restart): verified anew
    again = weight_version()
    back.kill()
    back.wait()
    write_result({"here": here, "ip": ip, "answers": answers, "ours_seen": ours_seen(), "gone": gone,
                  "refused": refused, "squatter_seen": squatter_seen(), "back_seen": back_seen(), "again": again,
                  "check_ms": check_ms, "key": str(key)})
""")


def test_a_listener_on_a_freed_port_of_another_node_never_receives_the_key(simulated_cluster):
    result, seen = run_driver(_DRIVER, simulated_cluster.address, timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    bearer = f"Bearer {seen['key']}"
    assert seen["here"] != seen["ip"]  # the driver and the listener are on different Ray nodes
    assert seen["answers"] == ["3", []]
    assert [auth for path, auth in seen["ours_seen"] if path != "/health"] == [bearer, bearer]
    assert "nothing listens" in seen["gone"] and f"checked on node {seen['ip']}" in seen["gone"]
    for refused in seen["refused"]:  # the agent on that node found the squatter; the key was not sent
        assert "not by a server of this run" in refused and f"checked on node {seen['ip']}" in refused, refused
    paths = {path for path, _ in seen["squatter_seen"]}
    assert {"/health", "/liveness"} <= paths, seen["squatter_seen"]  # it was reached: by keyless polls only
    assert all(auth is None for _, auth in seen["squatter_seen"]), seen["squatter_seen"]
    assert seen["again"] == "3" and seen["back_seen"][-1][1] == bearer
    print(f"remote listener check: {seen['check_ms']:.1f} ms per request (agent call, verified listener)")
