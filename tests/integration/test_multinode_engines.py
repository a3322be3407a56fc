"""SGLang engines as Ray actors on cluster nodes: on the simulated cluster (nodes 127.0.0.2-4), an engine
pinned to 127.0.0.4 binds that address, is reached by the router (a child of the driver) at the URL
its actor reported, is restarted through its actor after a kill -9, and leaves nothing behind."""

import textwrap

import pytest

from lean_rl.testing.driver_result import run_driver

pytestmark = pytest.mark.integration

_DRIVER = textwrap.dedent("""
    import dataclasses, json, os, signal, sys, time
    import httpx, psutil, ray
    from lean_rl.utils.ray_utils import init_ray
    from lean_rl.testing.driver_result import write_result
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.backends.sglang.health import EngineMonitor
    from lean_rl.testing.sglang_engines import engine_config_for_tests

    address, model, run_dir, node = sys.argv[1:5]
    init_ray(address)
    cfg = engine_config_for_tests(model, "--rollout-num-engines", "1", "--engine-cpu-threads", "1")
    cfg = dataclasses.replace(cfg, on_cluster=True, engine_nodes=(node,))
    out = {}

    def generate(url):
        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        response = httpx.post(f"{url}/generate", json=body, headers=cfg.auth_headers(), timeout=120,
                              trust_env=False)
        response.raise_for_status()
        return response.json()["meta_info"]["completion_tokens"]

    def listen_ips(pids):
        ips = set()
        for pid in pids:
            try:
                conns = psutil.Process(pid).net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            ips |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
        return sorted(ips)

    def gone(pids):
        def running(pid):
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False
        return not any(running(p) for p in pids)

    group = EngineGroup(cfg, run_dir).start()
    try:
        actor = group._servers.actors[0]  # engine_servers.EngineServers
        out["engine_urls"] = group.engine_urls
        out["config_urls"] = list(group.config.engine_urls)
        out["router_url"] = group.router_url
        out["tokens"] = generate(group.router_url)
        pid = ray.get(actor.server_pid.remote())
        tree = ray.get(actor.tree_pids.remote())
        out["listen_ips"] = listen_ips([pid])  # the HTTP server; its scheduler's internal
        # torch.distributed store listens on loopback, which is node-local by design
        actor_id = actor._actor_id.hex()
        table = ray._private.state.actors()
        out["actor_node_ip"] = table[actor_id]["Address"]["IPAddress"]
        out["actor_state"] = table[actor_id]["State"]

        os.kill(pid, signal.SIGKILL)  # the server dies, its actor lives
        deadline = time.monotonic() + 30
        while group.engine_alive(0) and time.monotonic() < deadline:
            time.sleep(0.2)
        out["alive_after_kill"] = group.engine_alive(0)
        monitor = EngineMonitor(group, interval_s=3600)  # checked by hand, not by its thread
        monitor.check_once()
        out["restarts"] = monitor.total_restarts
        out["events"] = monitor.health[0].events
        new_pid = ray.get(actor.server_pid.remote())
        out["new_pid_differs"] = new_pid != pid
        out["alive_after_restart"] = group.engine_alive(0)
        out["urls_after_restart"] = group.engine_urls
        out["tokens_after_restart"] = generate(group.router_url)
        tree += ray.get(actor.tree_pids.remote())
        monitor.stop()
    finally:
        group.stop()
    deadline = time.monotonic() + 30
    while not gone(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    out["left_after_stop"] = [p for p in tree if not gone([p])]
    write_result(out)
""")


# slow (suite time, issue 24): an engine on another node serves by default in tests/e2e/test_multinode.py
@pytest.mark.slow
def test_engine_actor_on_a_cluster_node_serves_restarts_and_stops(simulated_cluster, tiny_qwen2, tmp_path):
    node = simulated_cluster.node_ips[2]  # 127.0.0.4
    result, out = run_driver(_DRIVER, simulated_cluster.address, str(tiny_qwen2), str(tmp_path / "engines"), node,
                             timeout_s=170)
    assert result.returncode == 0 and out, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-5000:]}"
    url = out["engine_urls"][0]
    assert url.startswith(f"http://{node}:"), out
    assert out["config_urls"] == out["engine_urls"], out
    assert out["tokens"] == 4, out
    assert out["listen_ips"] == [node], out  # the server process binds its node's address only
    assert out["actor_node_ip"] == node and out["actor_state"] == "ALIVE", out
    assert out["alive_after_kill"] is False, out
    assert out["restarts"] == 1 and out["new_pid_differs"] and out["alive_after_restart"], out
    assert out["urls_after_restart"] == [url], out  # same port
    assert out["tokens_after_restart"] == 4, out
    assert out["left_after_stop"] == [], out
