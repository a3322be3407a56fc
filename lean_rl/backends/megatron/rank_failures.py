"""What a failed call of the trainer's ranks (rank_actors.RankActors) reports: the group's nodes that Ray
reports dead, with their ranks, or else the failing rank and its error. Ray declares a node dead only
after a few missed health checks, so a rank that died, or a collective that lost its peer, waits for
Ray's verdict (bounded)."""

from __future__ import annotations

import time


# what a gloo / NCCL collective reports when a peer rank's process (or node) went away
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET",
             "Connection refused", "NCCL communicator was aborted", "remote process exited")


def failure_message(what: str, rank: int, error: BaseException, cause: BaseException, nodes: list[str],
                    actor_ids: list[str], node_loss_wait_s: float) -> str:
    """The message of a failed group call: the lost nodes and their ranks if Ray reports any (waiting for
    its verdict up to `node_loss_wait_s` when the rank died or lost a peer), else the rank's failure."""
    import ray

    text = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else ""
    first = f"rank {rank} ({type(cause).__name__}: {text})"
    died = isinstance(error, ray.exceptions.RayActorError)
    # A rank that died, or a peer's collective that lost its connection: wait (bounded) for Ray to
    # tell whether a node went (it notices a dead raylet only after a few missed health checks).
    peer_lost = died or any(word in str(cause) for word in PEER_LOST)
    lost = lost_nodes(nodes, actor_ids, node_loss_wait_s if peer_lost else 0.0)
    if lost:
        return f"{what}: {lost_node_note(lost)}first failure: {first}; group shut down"
    if died:
        node = nodes[rank] if rank < len(nodes) else "?"
        return (f"{what}: rank {rank} (MegatronRank) on node {node} died ({type(cause).__name__}: {text}); "
                f"Ray still reports node {node} alive; group shut down")
    return f"{what} failed on rank {rank} ({type(cause).__name__}: {cause}); group shut down"


def lost_nodes(nodes: list[str], actor_ids: list[str], wait_s: float) -> dict[str, list[int]]:
    """The group's nodes (`nodes`: per rank, its node) that Ray reports dead, each with its ranks; polled
    up to `wait_s` for one, or until Ray reports a rank's actor (`actor_ids`) dead on a live node (a
    crashed process, not a lost node)."""
    from ray._private import state

    deadline = time.monotonic() + wait_s
    while nodes:
        try:
            lost = dead_nodes_now(nodes)
            if lost or time.monotonic() >= deadline:
                return lost
            if any((state.actors(actor_id=a) or {}).get("State") == "DEAD" for a in actor_ids):
                return dead_nodes_now(nodes)  # once more: the node may have been declared dead meanwhile
        except Exception:  # noqa: BLE001 - no answer from the GCS: say nothing rather than guess
            return {}
        time.sleep(0.5)
    return {}


def dead_nodes_now(nodes: list[str]) -> dict[str, list[int]]:
    import ray

    alive = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    return {ip: [r for r, node in enumerate(nodes) if node == ip] for ip in sorted(set(nodes) - alive)}


def lost_node_note(lost: dict[str, list[int]]) -> str:
    return "".join(f"node {ip} is lost (Ray reports it dead): ranks {ranks} (MegatronRank) died; "
                   for ip, ranks in lost.items())
