"""Where the engine actors run: Ray resources and scheduling per engine.

One path for one node and a cluster. Each engine is an EngineActor (engine_actor.py) scheduled by:
- `EnginePlacement` (--colocate): into the trainer's placement group, engine i into the bundle of the
  trainer node whose devices it takes turns on, with the share of that bundle the ranks leave free;
- `engine_nodes` (tests): pinned to the Ray node at that address;
- otherwise a placement group of its own, one bundle per engine, SPREAD: `--rollout-num-gpus-per-engine`
  GPUs each, which Ray then reserves (a trainer rank and an engine never share a GPU by accident).
  On CPU a cluster engine's bundle is its compute threads (a "GPU" is a CPU bundle); on one CPU node
  the engines reserve nothing (their servers share the cores by --engine-cpu-threads, not by Ray, so
  that Ray's CPUs stay with the trainer ranks on a 2-core machine).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from lean_rl.backends.sglang.config import EngineConfig


class EnginePlacementError(RuntimeError):
    """The cluster has no room for the engines; the message says what was asked and what there is."""


@dataclass(frozen=True)
class EnginePlacement:
    """Engines placed into another group's placement group (the trainer's, colocated): per engine its
    bundle index, its Ray resources there ({"CPU": .., "GPU": ..}, fractions of the bundle) and, on
    GPU, the GPU ids its server uses (CUDA_VISIBLE_DEVICES; Ray's own choice for a fraction is one
    GPU). The placement group belongs to its creator: the engine group leaves it alone."""

    placement_group: Any
    bundle_indices: tuple[int, ...]
    resources: tuple[dict[str, float], ...]
    visible_devices: tuple[tuple[str, ...], ...] = ()


def colocated_placement(placement_group, engine_nodes: list[int], *, device: str, ranks_per_node: int,
                        rank_gpu_ids: list[list[str]], rank_share: float, cpus_per_rank: float,
                        gpus_per_engine: int) -> EnginePlacement:
    """--colocate: engine i into the trainer's bundle of node engine_nodes[i] (TrainerLayout.
    colocated_engine_nodes), with the share of it the ranks leave (they take `rank_share` of a device
    each), split evenly between the engines of that node. On GPU each engine's fraction fits on one GPU
    even if Ray packs them all there; its server's devices are those of the node's ranks
    slot * gpus_per_engine, ... (the GPUs it takes turns on with them, by their Ray ids), not Ray's pick."""
    on_node = {node: engine_nodes.count(node) for node in engine_nodes}
    free = 1 - rank_share
    resources, gpus = [], []
    for index, node in enumerate(engine_nodes):
        if device == "cuda":
            resources.append({"CPU": 0.0, "GPU": round(free * 0.8 / on_node[node], 4)})
            slot = engine_nodes[:index].count(node)
            first = node * ranks_per_node + slot * gpus_per_engine
            gpus.append(tuple(gpu for rank in range(first, first + gpus_per_engine) for gpu in rank_gpu_ids[rank]))
        else:
            resources.append({"CPU": round(ranks_per_node * cpus_per_rank * free / on_node[node], 4), "GPU": 0.0})
    return EnginePlacement(placement_group, tuple(engine_nodes), tuple(resources), tuple(gpus))


def engine_bundle(config: EngineConfig) -> dict[str, float]:
    """What one engine reserves in Ray when it is placed on its own (empty: nothing)."""
    if config.device != "cpu":
        return {"GPU": float(config.gpus_per_engine)}
    return {"CPU": float(config.threads_per_cpu_engine)} if config.on_cluster else {}


class EngineScheduler:
    """Creates (and removes) the engines' own placement group when they need one, and gives the Ray
    actor options of engine i."""

    def __init__(self, config: EngineConfig, placement: EnginePlacement | None = None, name: str = "engines"):
        if placement is not None and (config.engine_nodes or len(placement.bundle_indices) != config.num_engines):
            raise ValueError(f"EngineGroup: a placement for {len(placement.bundle_indices)} engines needs a config "
                             f"of as many engines ({config.num_engines}) and no engine_nodes")
        self.config = config
        self.placement = placement
        self.name = name  # of the engine group: names its placement group
        self._own_group = None

    def reserve(self) -> None:
        """Our own placement group, ready; or an error naming what did not fit (checked against the
        cluster's total first, so an impossible request fails now, not after --engine-start-timeout)."""
        bundle = engine_bundle(self.config)
        if self.config.engine_nodes or self.placement is not None or not bundle:
            return
        import ray
        from ray.util.placement_group import placement_group

        n = self.config.num_engines
        total = ray.cluster_resources()
        for name, amount in bundle.items():
            if amount * n > total.get(name, 0):
                raise EnginePlacementError(
                    f"{n} engine(s) x {bundle} do not fit in the Ray cluster ({name}: {total.get(name, 0):g} in "
                    f"all, the trainer's included); lower --rollout-num-gpus or use --colocate")
        self._own_group = placement_group([dict(bundle) for _ in range(n)], strategy="SPREAD",
                                          name=f"lean_rl-{self.name}-{os.getpid()}")
        if not self._own_group.wait(timeout_seconds=self.config.start_timeout_s):
            raise EnginePlacementError(
                f"no room in the Ray cluster for {n} engines of {bundle} each (placement group not ready after "
                f"{self.config.start_timeout_s:.0f} s; other actors hold the rest); cluster: {ray.available_resources()}")

    def actor_options(self, index: int) -> tuple[dict, str | None]:
        """(Ray actor options, CUDA_VISIBLE_DEVICES for the server or None) of engine `index`."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = engine_bundle(self.config) if self.placement is None else self.placement.resources[index]
        # max_concurrency: alive / log_tail answer while a start or restart waits for health.
        options: dict = {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0), "max_concurrency": 4}
        visible_devices = None
        if self.placement is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.placement.placement_group,
                placement_group_bundle_index=self.placement.bundle_indices[index])
            if self.placement.visible_devices:
                visible_devices = ",".join(self.placement.visible_devices[index])
        elif self.config.engine_nodes:
            options["resources"] = {f"node:{self.config.engine_nodes[index]}": 0.001}
        elif self._own_group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._own_group, placement_group_bundle_index=index)
        return options, visible_devices

    def node_ids(self) -> list[str]:
        """The Ray node ids the engines run on, once reserved (where it is not known: every alive node)."""
        from lean_rl.backends.sglang import key_placement

        if self.placement is not None:
            return key_placement.node_ids_of_bundles(self.placement.placement_group, self.placement.bundle_indices)
        if self.config.engine_nodes:
            return key_placement.node_ids_at(self.config.engine_nodes)
        if self._own_group is not None:
            return key_placement.node_ids_of_bundles(self._own_group)
        return key_placement.all_node_ids()

    def release(self) -> None:
        group, self._own_group = self._own_group, None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 - Ray already gone
                pass
