"""The simulated cluster multi-node tests run on: one Ray node per loopback address, each a process
group of its own that teardown ends (and nothing else)."""

import textwrap

import pytest

from lean_rl.testing.driver_result import run_driver
from lean_rl.testing.ray_cluster import SimulatedCluster, _group_alive

pytestmark = pytest.mark.integration

_DRIVER = textwrap.dedent("""
    import sys, ray
    from lean_rl.testing.driver_result import write_result
    from lean_rl.utils.ray_utils import init_ray
    init_ray(sys.argv[1])

    @ray.remote(num_cpus=0)
    def where():
        from lean_rl.utils.net import service_host
        return [ray.util.get_node_ip_address(), service_host(on_cluster=True), service_host(on_cluster=False)]

    ips = sys.argv[2].split(",")
    write_result(ray.get([where.options(resources={f"node:{ip}": 0.01}).remote() for ip in ips]))
""")


def test_tasks_run_on_the_node_they_are_placed_on_and_see_its_address(simulated_cluster):
    result, seen = run_driver(_DRIVER, simulated_cluster.address, ",".join(simulated_cluster.node_ips), timeout_s=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen == [[ip, ip, "127.0.0.1"] for ip in simulated_cluster.node_ips]


# slow (suite time, issue 24): the test harness's own teardown; every multi-node test uses it
@pytest.mark.slow
def test_teardown_ends_every_process_of_the_cluster_and_only_those():
    cluster = SimulatedCluster(num_nodes=2, cpus_per_node=1, first_ip="127.0.0.5").start()
    groups = [node.pgid for node in cluster.nodes]
    assert all(_group_alive(g) for g in groups)
    cluster.kill_node("127.0.0.6")
    assert not _group_alive(groups[1]) and _group_alive(groups[0])
    cluster.stop()
    assert not any(_group_alive(g) for g in groups)
