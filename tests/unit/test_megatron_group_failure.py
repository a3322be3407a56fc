"""MegatronGroup's failure messages (rank_failures.py, for rank_actors.RankActors) when a node is lost,
with Ray's node / actor tables faked."""

import ray
from ray._private import state

from lean_rl.backends.megatron.rank_failures import failure_message


def _failure_message(nodes, what, rank, error, cause, wait_s=2.0):
    """The message of a group whose rank i runs on nodes[i] as Ray actor a<i>."""
    return failure_message(what, rank, error, cause, list(nodes), [f"a{i}" for i in range(len(nodes))], wait_s)


def _fake_ray(monkeypatch, dead_nodes=(), dead_actors=()):
    nodes = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeManagerAddress": ip, "Alive": ip not in dead_nodes}
                                               for ip in nodes])
    monkeypatch.setattr(state, "actors", lambda actor_id=None: {"State": "DEAD" if actor_id in dead_actors
                                                                else "ALIVE"})


def test_peer_lost_names_the_dead_node_and_its_ranks(monkeypatch):
    _fake_ray(monkeypatch, dead_nodes={"127.0.0.3"})
    cause = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4998. This is ...")
    message = _failure_message(["127.0.0.2", "127.0.0.3"], "RankTrainer.train_step", 0, cause, cause)
    assert message.startswith("RankTrainer.train_step: node 127.0.0.3 is lost (Ray reports it dead): ranks [1] "
                              "(MegatronRank) died; first failure: rank 0 (RuntimeError: ")
    assert message.endswith("group shut down")


def test_rank_error_on_live_nodes_does_not_wait(monkeypatch):
    import time

    _fake_ray(monkeypatch)
    started = time.monotonic()
    message = _failure_message(["127.0.0.2", "127.0.0.3"], "load_hf_checkpoint", 1, KeyError("x"), KeyError("x"),
                               wait_s=30.0)
    assert time.monotonic() - started < 1.0
    assert message == "load_hf_checkpoint failed on rank 1 (KeyError: 'x'); group shut down"


def test_crashed_rank_on_live_node_ends_the_wait_early(monkeypatch):
    import time

    _fake_ray(monkeypatch, dead_actors={"a1"})
    started = time.monotonic()
    cause = RuntimeError("Connection reset by peer")
    assert _failure_message(["127.0.0.2", "127.0.0.3"], "RankTrainer.train_step", 0, cause, cause, wait_s=30.0) == \
        "RankTrainer.train_step failed on rank 0 (RuntimeError: Connection reset by peer); group shut down"
    assert time.monotonic() - started < 5.0
