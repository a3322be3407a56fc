"""InProcessRank: the ranks' face (as RankActors) for a group of one rank hosted in this process, without
Ray (scripts/gpu-smoke.sh on a machine with torch and Megatron-core only)."""

from __future__ import annotations

from typing import Callable, Sequence

from lean_rl.backends.megatron.rank_errors import MegatronGroupError
from lean_rl.backends.megatron.trainer_layout import TrainerLayout


class InProcessRank:
    """RankActors' face for one rank hosted in this process, without Ray: a group of world size 1 where
    Ray is not installed (scripts/gpu-smoke.sh on a machine with torch and Megatron-core only). Calls
    run in the caller's thread, with no deadline of their own (nothing to kill but ourselves)."""

    def __init__(self):
        self.actor = None
        self.actor_ids, self.pids, self.nodes, self.gpu_ids = [], [], [], []
        self.placement_group = None
        self.node_loss_wait_s = 0.0

    def start(self, actor_class: type, rank_args: Callable[[int], tuple], layout: TrainerLayout, *,
              env: dict[str, str], **_placement) -> None:
        import os

        if layout.world_size != 1 or layout.on_cluster:
            raise MegatronGroupError(f"an in-process group has one rank on this node; the layout has "
                                     f"{layout.world_size}")
        os.environ.update(env)  # OMP threads, NCCL switches: as a rank actor's runtime_env would set them
        self.actor = actor_class(*rank_args(0))
        self.actor_ids, self.pids, self.nodes = ["in-process"], [os.getpid()], ["127.0.0.1"]
        self.gpu_ids = [[os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]]] if layout.device == "cuda" else [[]]

    def call_all(self, fn: Callable, *args, timeout_s: float) -> list:
        return self.call_each(fn, [args], timeout_s)

    @staticmethod
    def share(value):
        return value  # the one rank is here

    def call_each(self, fn: Callable, per_rank_args: Sequence[tuple], timeout_s: float) -> list:
        if self.actor is None:
            raise MegatronGroupError(f"{fn.__qualname__}: the group is shut down")
        try:
            return [self.actor.call(fn, *per_rank_args[0])]
        except Exception as error:
            self.shutdown()
            raise MegatronGroupError(f"{fn.__qualname__} failed on rank 0 ({type(error).__name__}: {error}); "
                                     "group shut down") from error

    def call_first(self, fn: Callable, *args, timeout_s: float):
        return self.call_all(fn, *args, timeout_s=timeout_s)[0]

    def shutdown(self, wait_s: float = 30.0, keep_placement: bool = False) -> None:
        actor, self.actor = self.actor, None
        if actor is not None:
            actor.shutdown()
