"""Where each trainer rank starts, and with what environment: alone (a bundle per trainer node, one GPU or
some CPUs per rank), --colocate (the same bundles shared with the engines: COLOCATED_RANK_SHARE of a
device per rank), or beside another group's ranks (PPO's critic under --colocate); and the environment
of a rank actor (threads, PYTHONPATH, the NCCL switches SGLang forces on its servers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lean_rl.backends.megatron.trainer_layout import TrainerLayout

if TYPE_CHECKING:
    from lean_rl.backends.megatron.rank_actors import RankActors


# --colocate on a cluster: a rank's share of its GPU (or CPUs); engines in its bundle get the rest.
COLOCATED_RANK_SHARE = 0.75


# NCCL switches of every trainer rank on GPU, equal to what SGLang forces on its servers
# (sglang/srt/entrypoints/engine.py:1897-1914): a rank and the engines meet in one NCCL group for the
# distributed weight sync, and peers that disagree on cuMem fail there (review C6; slime sets the same).
TRAINER_NCCL_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}


def rank_env(device: str, num_threads: int, pythonpath: str | None) -> dict[str, str]:
    """The environment of a rank actor: OMP threads; the driver's PYTHONPATH, so that the ranks import
    what it imports (a --custom-loss-function-path module is called there; on a cluster the same paths
    must exist on every node); on GPU TRAINER_NCCL_ENV. The gloo / NCCL socket interface is set by each
    rank (init_distributed), from the address of the node it landed on."""
    env = {"OMP_NUM_THREADS": str(num_threads)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if device == "cuda":
        env.update(TRAINER_NCCL_ENV)
    return env


def place_ranks(ranks: RankActors, rank_class: type, rank_args, layout: TrainerLayout, *, env: dict[str, str],
                num_cpus_per_actor: float, colocated: bool, colocate_with: RankActors | None,
                timeout_s: float, placement_group=None) -> None:
    """Start `rank_class(*rank_args(rank))` for every rank of `layout` in `ranks`, placed as a run needs:
    - alone: a bundle per trainer node with one GPU (or num_cpus_per_actor CPUs) per rank;
    - `colocated` (--colocate): the same bundles, each rank taking COLOCATED_RANK_SHARE of its device
      (> 1/2 of a GPU, so two ranks never share one; Ray picks it) and leaving the rest to the engines;
    - `colocate_with` (PPO's critic under --colocate, review C4): in the other group's bundles, rank i
      on the GPU of that group's rank i (CUDA_VISIBLE_DEVICES set to its Ray GPU id, nothing reserved:
      the two models take turns there, the critic offloaded with the actor), or with no CPU reserved
      on CPU. Asking Ray for GPUs of its own would wait forever: the actor's bundles hold them all.
    `placement_group`: the bundles of a failed group, kept (--colocate: the engines are in them) for the
    group a trainer heal starts; adopted, as if reserved here."""
    if layout.device != "cuda" and num_cpus_per_actor <= 0:
        raise ValueError(f"MegatronGroup: num_cpus_per_actor must be > 0 on CPU, got {num_cpus_per_actor}")
    if colocate_with is not None:
        beside = colocate_with.gpu_ids if layout.device == "cuda" else None
        ranks.start(rank_class, rank_args, layout, num_cpus=0, num_gpus=0, env=env,
                    cpus_per_rank=num_cpus_per_actor, timeout_s=timeout_s,
                    placement_group=colocate_with.placement_group,
                    rank_env=None if beside is None else (lambda rank: {"CUDA_VISIBLE_DEVICES": ",".join(beside[rank])}))
        return
    share = COLOCATED_RANK_SHARE if colocated else 1
    ranks.start(rank_class, rank_args, layout,
                num_cpus=num_cpus_per_actor if layout.device == "cuda" else num_cpus_per_actor * share,
                num_gpus=share if layout.device == "cuda" else 0, env=env, cpus_per_rank=num_cpus_per_actor,
                timeout_s=timeout_s, placement_group=placement_group, adopt_placement=placement_group is not None)
