"""The whole loop on a Ray cluster: trainer ranks and SGLang engines placed on different nodes of a
simulated cluster (one Ray node per loopback address), every address the node's own."""

import re

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

from lean_rl.testing.ray_cluster import SimulatedCluster, actor_table

pytestmark = pytest.mark.e2e


def test_tp2_over_two_nodes_with_the_engine_on_a_third(tiny_qwen2, toy_data, tmp_path):
    # One CPU per node: the two trainer ranks (half a CPU each, one bundle per node) and the engine
    # (one CPU) cannot share a node, so the three land on three nodes whatever the start order.
    with SimulatedCluster(num_nodes=3, cpus_per_node=1, first_ip="127.0.0.8") as cluster:
        result = run_lean_rl("lean_rl.train", run_flags(
            tiny_qwen2, toy_data, tmp_path, "--ray-address", cluster.address, "--num-rollout", "3",
            "--actor-num-nodes", "2", "--tensor-model-parallel-size", "2", "--micro-batch-size", "8"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        actors = actor_table(cluster.address)

    ranks = sorted(a["ip"] for a in actors if a["class"] == "MegatronRank")
    engines = [a["ip"] for a in actors if a["class"] == "EngineActor"]
    assert len(ranks) == 2 and len(set(ranks)) == 2, actors  # one rank per node
    assert len(engines) == 1 and engines[0] not in ranks and engines[0] in cluster.node_ips, actors
    # the engine's server bound its node's address (the URL the router and weight sync used), and the
    # router the driver's node (the head's)
    urls = re.search(r"engines \['http://([\d.]+):\d+'\] and router http://([\d.]+):\d+", result.stderr)
    assert urls and urls.group(1) == engines[0] and urls.group(2) == cluster.first_ip, result.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # weights crossed nodes (gloo group between trainer rank 0's node and the engine's) and arrived
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)


# slow (suite time, issue 24): the default multi-node run is the TP=2 one above
@pytest.mark.slow
def test_colocate_across_two_nodes(simulated_cluster, tiny_qwen2, toy_data, tmp_path):
    # --colocate on a cluster: the engines go into the trainer's placement group, engine i into the
    # bundle of trainer node i (2 engines over 2 trainer nodes), so the third node stays empty.
    def key(actor):  # an actor of an earlier run may change state meanwhile, not its pid
        return actor["class"], actor["ip"], actor["pid"]

    before = {key(a) for a in actor_table(simulated_cluster.address)}
    result = run_lean_rl("lean_rl.train", run_flags(
        tiny_qwen2, toy_data, tmp_path, "--ray-address", simulated_cluster.address, "--num-rollout", "3",
        "--colocate", "--actor-num-nodes", "2", "--tensor-model-parallel-size", "2",
        "--rollout-num-engines", "2", "--micro-batch-size", "8"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    actors = [a for a in actor_table(simulated_cluster.address) if key(a) not in before]

    ranks = [a["ip"] for a in actors if a["class"] == "MegatronRank"]
    engines = [a["ip"] for a in actors if a["class"] == "EngineActor"]
    assert len(ranks) == 2 and len(set(ranks)) == 2, actors  # one rank per trainer node
    assert sorted(engines) == sorted(ranks), actors  # each engine beside a rank; both nodes host one
    # the run's own account: engine i on trainer node i, in the trainer's bundles
    placed = re.search(r"placement: engines on nodes \[([^]]*)\]; trainer ranks on nodes \[([^]]*)\] "
                       r"\(colocated: engines in the trainer's bundles\)", result.stderr)
    assert placed, result.stderr[-3000:]
    engine_nodes, rank_nodes = (re.findall(r"'([\d.]+)'", group) for group in placed.groups())
    assert engine_nodes == rank_nodes and sorted(engine_nodes) == sorted(engines), result.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)
