"""The trainer's nodes reserved in Ray before its ranks start: one placement-group bundle per trainer
node (STRICT_SPREAD over distinct Ray nodes when there are several, PACK for one), each rank's
scheduling strategy into its node's bundle, and the wait for Ray to report actors dead."""

from __future__ import annotations

import time

from lean_rl.backends.megatron.rank_errors import PlacementError
from lean_rl.backends.megatron.trainer_layout import TrainerLayout


def reserve_nodes(layout: TrainerLayout, cpus_per_rank: float, timeout_s: float):
    """A placement group of one bundle per trainer node (its ranks' CPUs, and GPUs on CUDA), on
    distinct Ray nodes (STRICT_SPREAD) when there are several; ready, or an error that says why not."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    per_node = layout.ranks_per_node
    bundle = {"CPU": per_node * cpus_per_rank}
    if layout.device == "cuda":
        bundle["GPU"] = per_node
    bundle = {name: amount for name, amount in bundle.items() if amount > 0}
    strategy = "STRICT_SPREAD" if layout.num_nodes > 1 else "PACK"
    what = f"{layout.num_nodes} trainer node(s) x {per_node} rank(s) ({bundle} per node, {strategy})"
    alive = [node for node in ray.nodes() if node["Alive"]]
    if layout.num_nodes > len(alive):
        raise PlacementError(f"cannot place {what}: the Ray cluster has {len(alive)} node(s) alive "
                                 f"({', '.join(n['NodeManagerAddress'] for n in alive)})")
    group = placement_group([dict(bundle) for _ in range(layout.num_nodes)], strategy=strategy)
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        free = {f"{n['NodeManagerAddress']}": {k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU")}
                for n in alive}
        raise PlacementError(f"cannot place {what} within {timeout_s:.0f}s (node resources: {free}; other "
                                 "actors may hold them)")
    return group


def node_bundle(group, index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def wait_actors_dead(actor_ids: list[str], timeout_s: float) -> set[str]:
    """Poll Ray's actor table until every actor is DEAD (or absent); returns those that are not."""
    from ray._private import state

    deadline = time.monotonic() + timeout_s
    left = set(actor_ids)
    while left:
        left = {a for a in left if (state.actors(actor_id=a) or {}).get("State", "DEAD") != "DEAD"}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return left
