"""TrainerLayout: where the trainer's ranks run (device, world size, data-parallel size, nodes, on a Ray
cluster or not), derived once at start-up from the parallel flags and --actor-num-* (train_config.PlacementConfig.layout)."""

from __future__ import annotations

from dataclasses import dataclass

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.options import ConfigError


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class TrainerLayout:
    """Where the trainer's ranks run, derived once at start-up: the device, the number of ranks and
    the data-parallel size of the layout (which validates the world size against it), over how many
    nodes (ranks of node k are ranks k * ranks_per_node ...), and whether the run is on a Ray cluster
    (--ray-address: services bind the node's address, utils.net.service_host) or on this node alone."""

    device: str  # "cpu" | "cuda"
    world_size: int
    data_parallel_size: int
    num_nodes: int = 1
    on_cluster: bool = False

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.num_nodes

    @classmethod
    def derive(cls, parallel: ParallelConfig, world_size: int, device: str, num_nodes: int = 1,
               on_cluster: bool = False) -> TrainerLayout:
        _require(device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {device!r}")
        _require(isinstance(num_nodes, int) and num_nodes >= 1, f"--actor-num-nodes must be >= 1, got {num_nodes!r}")
        _require(num_nodes == 1 or on_cluster,
                 f"--actor-num-nodes {num_nodes} needs a Ray cluster (--ray-address HOST:PORT): without one "
                 "the run starts a Ray of its own on this node only")
        _require(world_size % num_nodes == 0,
                 f"{world_size} trainer ranks do not split evenly over --actor-num-nodes {num_nodes}")
        return cls(device, world_size, parallel.data_parallel_size(world_size), num_nodes, on_cluster)

    def colocated_engine_nodes(self, num_engines: int, gpus_per_engine: int = 0) -> list[int]:
        """--colocate: per engine, the trainer node (placement-group bundle) it shares
        devices with. E engines over N trainer nodes: E a multiple of N (E / N engines per node,
        engines numbered node by node) or a divisor of N (engine i on node i * N / E)."""
        n = self.num_nodes
        _require(num_engines % n == 0 or n % num_engines == 0,
                 f"--colocate places every engine on a trainer node: --rollout-num-engines "
                 f"({num_engines}) must be a multiple of --actor-num-nodes ({n}) or divide it evenly")
        per_node = max(num_engines // n, 1)
        if self.device == "cuda":
            _require(per_node * gpus_per_engine <= self.ranks_per_node,
                     f"--colocate: {per_node} engine(s) x --rollout-num-gpus-per-engine {gpus_per_engine} per "
                     f"trainer node need more GPUs than the node's {self.ranks_per_node} "
                     "(--actor-num-gpus-per-node)")
        if num_engines >= n:
            return [i // per_node for i in range(num_engines)]
        return [i * (n // num_engines) for i in range(num_engines)]
