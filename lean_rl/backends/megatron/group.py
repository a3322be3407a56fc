"""Driver side of the trainer: one Ray actor per Megatron rank (rank.MegatronRank), called in lockstep.
A MegatronGroup serves one model: the policy (role "actor") or PPO's value model (role "critic"), as
set up by setup_training; train_driver.py trains on a rollout with one or both.

Placement: one placement-group bundle per trainer node (TrainerLayout.num_nodes; STRICT_SPREAD over
distinct Ray nodes when there are several, PACK for one), each holding that node's ranks; ranks are
numbered node by node (node k runs ranks k * ranks_per_node, ...). Each rank records its node's
address and pid (rank_nodes(), rank_pids()). With `colocated` (--colocate on a cluster) the ranks take
COLOCATED_RANK_SHARE of their devices and the SGLang engines go into the same bundles (runtime.py).

Lifetime: actors are ordinary (non-detached) Ray actors owned by this driver, so Ray kills them when
the driver exits; any failed or timed-out call kills the whole group before the error propagates
(the other ranks would otherwise sit in a collective until the gloo/NCCL timeout), and shutdown()
waits for the actor processes to be gone: with psutil for ranks on the driver's node, through Ray's
actor table (state DEAD) for ranks on other nodes. Every wait has a deadline.

Node loss: when a rank dies, or a collective loses its peer, the error names the group's nodes that
Ray reports dead and their ranks, waiting for Ray's verdict at most node_loss_wait_s (Ray declares a
node dead only after some missed health checks); ranks on a dead node are not waited for at shutdown."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import psutil
import torch

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.distributed import RankLayout
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, check_arch_matches_checkpoint, hf_family
from lean_rl.backends.megatron.rank import MegatronRank
from lean_rl.backends.megatron.scoring_plan import plan_scoring
from lean_rl.backends.megatron.train_config import BatchPlan, TrainConfig, TrainerLayout
from lean_rl.utils.device import detect_device

logger = logging.getLogger(__name__)

# --colocate on a cluster: a rank's share of its GPU (or CPUs); engines in its bundle get the rest.
COLOCATED_RANK_SHARE = 0.75


class MegatronGroupError(RuntimeError):
    """A call failed or timed out on some rank; the group has been shut down."""


@dataclass(frozen=True)
class LogProbOutput:
    log_probs: list[torch.Tensor]  # per sequence: float32 [len - score_from]
    entropy: list[torch.Tensor] | None  # same shapes, when asked for


class MegatronGroup:
    def __init__(self, config: MegatronConfig, *, layout: TrainerLayout | None = None, world_size: int | None = None,
                 device: str | None = None, num_cpus_per_actor: float = 0.5, seed: int = 1234, num_threads: int = 1,
                 start_timeout_s: float = 300.0, call_timeout_s: float = 600.0, dist_timeout_s: float = 300.0,
                 colocated: bool = False, node_loss_wait_s: float = 45.0):
        """Start one actor per rank, initialise torch.distributed + parallel_state on each and build
        the model (random weights). `layout`: as a run derived it at start-up (cfg.layout); a group
        used on its own gives `world_size` (default: the smallest world for the parallel layout) and
        `device` (default: utils.device.detect_device()). `colocated` (--colocate on a cluster): the
        ranks take only COLOCATED_RANK_SHARE of their devices, leaving the rest of each node's bundle
        to the engines placed into it (colocated_engine_resources)."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("MegatronGroup needs a running Ray: call ray.init() first")
        if layout is None:
            layout = TrainerLayout.derive(config.parallel, world_size or config.parallel.min_world_size,
                                          device or detect_device())
        elif world_size is not None or device is not None:
            raise ValueError("MegatronGroup: give either layout or world_size / device, not both")
        self.config, self.trainer_layout = config, layout
        self.world_size, self.data_parallel_size, self.device = layout.world_size, layout.data_parallel_size, layout.device
        device = layout.device
        self.call_timeout_s = call_timeout_s
        self.node_loss_wait_s = node_loss_wait_s
        self.family: str | None = None
        # set by setup_training: TrainConfig, AlgorithmConfig, and the model served: "actor" | "critic"
        self.train_config = None
        self.algorithm_config = None
        self.role: str | None = None
        self.batch_plan: BatchPlan | None = None
        self._actors: list[Any] = []
        self._actor_ids: list[str] = []
        self._pids: list[int] = []
        self._nodes: list[str] = []  # per rank: its node's address, as Ray knows it
        self._placement_group = None
        self._gpu_ids: list[list] = []  # per rank: the GPU ids Ray gave it (on its node)
        self.colocated = colocated
        self.cpus_per_rank = num_cpus_per_actor
        if device != "cuda" and num_cpus_per_actor <= 0:
            raise ValueError(f"MegatronGroup: num_cpus_per_actor must be > 0 on CPU, got {num_cpus_per_actor}")
        # OMP threads per rank. The gloo / NCCL socket interface is set by each rank (init_distributed),
        # from the address of the node it landed on.
        env = {"OMP_NUM_THREADS": str(num_threads)}
        try:
            self._placement_group = _reserve_nodes(layout, num_cpus_per_actor, start_timeout_s)
            per_node = layout.ranks_per_node
            # colocated: a fraction of a GPU (> 1/2, so that two ranks never share one) or of the CPUs
            share = COLOCATED_RANK_SHARE if colocated else 1
            for rank in range(self.world_size):
                actor_cls = ray.remote(MegatronRank).options(
                    num_cpus=num_cpus_per_actor if device == "cuda" else num_cpus_per_actor * share,
                    num_gpus=share if device == "cuda" else 0, max_restarts=0,
                    max_concurrency=1, runtime_env={"env_vars": env},
                    scheduling_strategy=_bundle(self._placement_group, rank // per_node))
                self._actors.append(actor_cls.remote(rank, self.world_size, config, device, seed, num_threads,
                                                     layout.on_cluster))
                self._actor_ids.append(self._actors[-1]._actor_id.hex())
            locations = self.call_all("location", timeout_s=start_timeout_s)
            self._nodes = [where["node_ip"] for where in locations]
            self._pids = [where["pid"] for where in locations]
            self._gpu_ids = [list(where.get("gpu_ids", ())) for where in locations]
            logger.info("trainer ranks on nodes %s (rank i on the i-th)", self._nodes)
            host, port = self._wait([self._actors[0].call.remote("open_rendezvous", dist_timeout_s)],
                                    start_timeout_s, "open_rendezvous")[0]
            self.rendezvous_host: str = host
            self.rendezvous_port: int = port
            self.layouts: list[RankLayout] = self.call_all("init_distributed", host, port, dist_timeout_s,
                                                           timeout_s=start_timeout_s)
            self.call_all("build_model", timeout_s=start_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def from_hf_checkpoint(cls, checkpoint_dir: str | Path, parallel: ParallelConfig, *,
                           make_vocab_size_divisible_by: int = 128, seq_length: int | None = None,
                           **kwargs) -> "MegatronGroup":
        """A group whose architecture comes from the checkpoint's config.json, with its weights loaded."""
        arch = arch_from_hf_config(checkpoint_dir, make_vocab_size_divisible_by, seq_length)
        group = cls(MegatronConfig(arch=arch, parallel=parallel), **kwargs)
        try:
            group.load_hf_checkpoint(checkpoint_dir)
        except BaseException:
            group.shutdown()
            raise
        return group

    def load_hf_checkpoint(self, checkpoint_dir: str | Path) -> None:
        """Each rank reads its own slices of the HF safetensors checkpoint."""
        family = hf_family(checkpoint_dir)
        check_arch_matches_checkpoint(self.config.arch, checkpoint_dir)  # fail here, before the actors
        self.call_all("load_hf_checkpoint", str(Path(checkpoint_dir).resolve()), family)
        self.family = family

    def compute_log_probs(self, token_ids: Sequence[Sequence[int]], score_from: Sequence[int] | None = None, *,
                          micro_batch_size: int = 8, with_entropy: bool = False) -> LogProbOutput:
        """log p(tokens[i][j] | tokens[i][:j]) for j in [score_from[i], len(tokens[i])) (default
        score_from 1: every token but the first), split over DP ranks and micro-batches."""
        par = self.config.parallel
        plan = plan_scoring([list(t) for t in token_ids], None if score_from is None else list(score_from),
                            data_parallel_size=self.data_parallel_size, micro_batch_size=micro_batch_size,
                            vocab_size=self.config.arch.vocab_size, max_seq_length=self.config.arch.seq_length,
                            length_multiple=par.tensor_model_parallel_size if par.sequence_parallel else 1)
        per_rank = [(plan.batches[layout.data_rank], with_entropy) for layout in self.layouts]
        results = self.call_each("compute_log_probs", per_rank)
        by_data_rank: dict[int, list] = {}
        for layout, result in zip(self.layouts, results):
            if result is not None:
                by_data_rank[layout.data_rank] = result
        rows = [by_data_rank[rank][row] for rank, row in plan.owners]
        return LogProbOutput(log_probs=[r["log_probs"] for r in rows],
                             entropy=[r["entropy"] for r in rows] if with_entropy else None)

    def gather_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model as HF-named tensors (TP/PP/EP shards gathered), on the driver."""
        if self.family is None:
            raise RuntimeError("gather_hf_state_dict needs the HF family: load an HF checkpoint first")
        return self.call_all("gather_hf_state_dict", self.family)[0]

    # -- model-only checkpoints and full logits (issue 6: checkpoint conversion) ---------------------

    def load_model_checkpoint(self, path: str | Path, step: int | None = None) -> Path:
        """Load the weights of a torch_dist checkpoint (model-only, e.g. from tools/convert_ckpt, or
        a full one) at this group's layout; `path` is a root (latest, or `step`) or one iter_* dir.
        Its hf_config/ folder, when present, sets the family (for gather_hf_state_dict)."""
        from lean_rl.backends.megatron.checkpoint_paths import HF_CONFIG_DIR, find_checkpoint

        _, directory = find_checkpoint(Path(path).resolve(), step)
        self.call_all("load_model_checkpoint", str(directory), None)
        if (directory / HF_CONFIG_DIR / "config.json").is_file():
            self.family = hf_family(directory / HF_CONFIG_DIR)
        return directory

    def save_model_checkpoint(self, root: str | Path, step: int, hf_config_dir: str | Path | None = None) -> Path:
        """Write the weights only ({"model": ...}, no optimizer) as ROOT/iter_{step:07d}."""
        hf_dir = None if hf_config_dir is None else str(Path(hf_config_dir).resolve())
        return Path(self.call_all("save_model_checkpoint", str(Path(root).resolve()), int(step), hf_dir)[0])

    def compute_logits(self, token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """float32 [len, vocab] logits per sequence (TP shards gathered, from the last stage)."""
        results = self.call_all("compute_logits", [list(t) for t in token_ids])
        return next(r for r in results if r is not None)

    # -- training: train_driver.py trains on a rollout through these and call_each("trainer.<method>") --

    def setup_training(self, train_config: TrainConfig, algorithm_config, role: str = "actor",
                       batch_plan: BatchPlan | None = None) -> None:
        """Wrap every rank's model in Megatron DDP and build its optimizer and LR schedule (the critic
        gets its value head first: load HF weights before this). `batch_plan`: as a run derived it at
        start-up (cfg.batch_plan); a group used on its own derives it here from the batch flags.
        train_driver.initialize_for_training does this from the flags."""
        plan = batch_plan or BatchPlan(train_config.batch, self.data_parallel_size)
        if plan.data_parallel_size != self.data_parallel_size:
            raise ValueError(f"batch plan for data-parallel size {plan.data_parallel_size}, group has "
                             f"{self.data_parallel_size}")
        self.call_all("setup_training", train_config, algorithm_config, role)
        self.train_config, self.algorithm_config, self.role = train_config, algorithm_config, role
        self.batch_plan = plan

    def save_checkpoint(self, root: str | Path, step: int, extra_state: dict | None = None) -> Path:
        """Model, optimizer, LR schedule, RNG, counters and `extra_state` (JSON-able, e.g. the
        DataBuffer's state_dict) as ROOT/iter_{step:07d}, published only once complete."""
        import json

        self.require_training()
        try:
            json.dumps(extra_state)
        except (TypeError, ValueError) as error:
            raise ValueError(f"save_checkpoint: extra_state is not JSON-serialisable ({error})") from error
        Path(root).mkdir(parents=True, exist_ok=True)
        return Path(self.call_all("trainer.save_checkpoint", str(Path(root).resolve()), int(step), extra_state)[0])

    def load_checkpoint(self, root: str | Path, step: int | None = None) -> tuple[int, dict | None]:
        """Restore the latest complete checkpoint under `root`, or that of `step` (any layout; a
        model-only checkpoint keeps a fresh optimizer). Returns (step, extra_state)."""
        from lean_rl.backends.megatron.checkpoint_paths import find_checkpoint

        self.require_training()
        find_checkpoint(root, step)  # fail here, not on every rank (which would take the group down)
        ckpt = self.train_config.checkpoint
        results = self.call_all("trainer.load_checkpoint", str(Path(root).resolve()), not ckpt.no_load_optim,
                                not ckpt.no_load_rng, step)
        return results[0]["step"], results[0]["extra_state"]

    def offload(self) -> dict:
        """Colocated mode: free the trainer's GPU memory while the engines generate (no-op on CPU)."""
        return self.call_all("trainer.offload")[0]

    def onload(self) -> dict:
        return self.call_all("trainer.onload")[0]

    def require_training(self) -> None:
        if self.train_config is None:
            raise RuntimeError("call setup_training() (or initialize_for_training()) first")

    def rank_pids(self) -> list[int]:
        """Per rank, its process id (on its own node: see rank_nodes)."""
        return list(self._pids)

    def rank_nodes(self) -> list[str]:
        """Per rank, the address of the Ray node it runs on."""
        return list(self._nodes)

    @property
    def placement_group(self):
        """The trainer's placement group: bundle k holds the ranks of trainer node k."""
        return self._placement_group

    def colocated_engine_resources(self, engines_on_node: int) -> dict[str, float]:
        """Ray resources of one of `engines_on_node` engines placed into a trainer node's bundle
        beside its ranks (colocated): what the ranks leave of the bundle, split evenly. On GPU each
        engine's fraction fits on one GPU even if Ray packs them all there; its server's devices are
        set by colocated_engine_gpus, not by Ray."""
        if not self.colocated:
            raise RuntimeError("colocated_engine_resources: the group was not started with colocated=True")
        free = 1 - COLOCATED_RANK_SHARE
        if self.device == "cuda":
            return {"CPU": 0.0, "GPU": round(free * 0.8 / engines_on_node, 4)}
        per_node = self.trainer_layout.ranks_per_node
        return {"CPU": round(per_node * self.cpus_per_rank * free / engines_on_node, 4), "GPU": 0.0}

    def colocated_engine_gpus(self, node: int, slot: int, gpus_per_engine: int) -> list[str]:
        """GPU: the GPU ids (on trainer node `node`) of the `slot`-th engine there: those of the
        node's ranks slot * gpus_per_engine, ... (the devices it takes turns on with them)."""
        per_node = self.trainer_layout.ranks_per_node
        ranks = range(node * per_node + slot * gpus_per_engine, node * per_node + (slot + 1) * gpus_per_engine)
        return [str(gpu) for rank in ranks for gpu in self._gpu_ids[rank]]

    def rank_actor_ids(self) -> list[str]:
        """Per rank, its Ray actor id (hex), as in Ray's actor table."""
        return list(self._actor_ids)

    def shutdown(self, wait_s: float = 30.0) -> None:
        """Kill every actor and wait (bounded) until their processes are gone: psutil for the ranks
        on the driver's node, Ray's actor table (DEAD) for the others. Then release the placement
        group. Idempotent."""
        import ray

        actors, self._actors = self._actors, []
        placement, self._placement_group = self._placement_group, None
        for actor in actors:
            ray.kill(actor, no_restart=True)
        try:
            self._wait_ranks_gone(len(actors), wait_s)
        finally:
            if placement is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(placement)

    def _wait_ranks_gone(self, num_actors: int, wait_s: float) -> None:
        import ray

        if not num_actors:
            return
        here = ray.util.get_node_ip_address()
        # a rank whose location is unknown (it failed to start) is waited for through Ray; one on a
        # node Ray reports dead is gone with its node (no raylet left to confirm it)
        lost = self._lost_nodes(0.0)
        remote = [(rank, actor_id) for rank, actor_id in enumerate(self._actor_ids[:num_actors])
                  if (rank >= len(self._nodes) or self._nodes[rank] != here)
                  and not (rank < len(self._nodes) and self._nodes[rank] in lost)]
        deadline = time.monotonic() + wait_s
        processes = []
        for pid in [pid for pid, node in zip(self._pids, self._nodes) if node == here]:
            try:
                processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(processes, timeout=wait_s)
        if alive:
            raise MegatronGroupError(f"actor processes {[p.pid for p in alive]} still alive {wait_s}s after ray.kill")
        left = _wait_actors_dead([actor_id for _, actor_id in remote], max(deadline - time.monotonic(), 1.0))
        if left:
            where = [f"rank {rank} on {self._nodes[rank] if rank < len(self._nodes) else '?'}"
                     + (f" (pid {self._pids[rank]})" if rank < len(self._pids) else "")
                     for rank, actor_id in remote if actor_id in left]
            raise MegatronGroupError(f"actors {', '.join(where)} not reported dead by Ray {wait_s}s after ray.kill")

    def __enter__(self) -> "MegatronGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- lockstep calls -------------------------------------------------------------------------

    def call_all(self, method: str, *args, timeout_s: float | None = None) -> list:
        """`method` with the same `args` on every rank, in lockstep; results in rank order. `method`
        names a rank method ("build_model"), a trainer method ("trainer.train_step") or one of an
        attached object ("weight_sync.setup"; rank.MegatronRank.call)."""
        return self.call_each(method, [args] * len(self._actors), timeout_s)

    def call_each(self, method: str, per_rank_args: Sequence[tuple], timeout_s: float | None = None) -> list:
        """As call_all, with one argument tuple per rank (rank order)."""
        if not self._actors:
            raise MegatronGroupError(f"{method}: the group is shut down")
        refs = [actor.call.remote(method, *args) for actor, args in zip(self._actors, per_rank_args)]
        return self._wait(refs, self.call_timeout_s if timeout_s is None else timeout_s, method)

    def _wait(self, refs: list, timeout_s: float, what: str) -> list:
        """Results in rank order; the first failure (not the last) ends the wait and the group. When
        a rank's node is gone (Ray reports it dead), the error says so: node, ranks lost."""
        import ray

        deadline = time.monotonic() + timeout_s
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        while pending:
            left = deadline - time.monotonic()
            ready = ray.wait(list(pending), num_returns=1, timeout=max(left, 0))[0] if left > 0 else []
            if not ready:
                ranks = sorted(pending.values())
                lost = self._lost_node_note(self._lost_nodes(0.0))
                self._shutdown_after_failure()
                raise MegatronGroupError(f"{what}: {lost}ranks {ranks} did not finish within {timeout_s:.0f}s; "
                                         "group shut down")
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
                except Exception as error:
                    cause = getattr(error, "cause", None) or error  # RayTaskError wraps the rank's exception
                    message = self._failure_message(what, rank, error, cause)
                    self._shutdown_after_failure()
                    raise MegatronGroupError(message) from error
        return results

    def _failure_message(self, what: str, rank: int, error: BaseException, cause: BaseException) -> str:
        import ray

        text = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else ""
        first = f"rank {rank} ({type(cause).__name__}: {text})"
        died = isinstance(error, ray.exceptions.RayActorError)
        # A rank that died, or a peer's collective that lost its connection: wait (bounded) for Ray to
        # tell whether a node went (it notices a dead raylet only after a few missed health checks).
        peer_lost = died or any(word in str(cause) for word in _PEER_LOST)
        lost = self._lost_nodes(self.node_loss_wait_s if peer_lost else 0.0)
        if lost:
            return f"{what}: {self._lost_node_note(lost)}first failure: {first}; group shut down"
        if died:
            node = self._nodes[rank] if rank < len(self._nodes) else "?"
            return (f"{what}: rank {rank} (MegatronRank) on node {node} died ({type(cause).__name__}: {text}); "
                    f"Ray still reports node {node} alive; group shut down")
        return f"{what} failed on rank {rank} ({type(cause).__name__}: {cause}); group shut down"

    def _lost_nodes(self, wait_s: float) -> dict[str, list[int]]:
        """The group's nodes that Ray reports dead, each with its ranks; polled up to `wait_s` for one,
        or until Ray reports a rank's actor dead on a live node (a crashed process, not a lost node)."""
        from ray._private import state

        deadline = time.monotonic() + wait_s
        while self._nodes:
            try:
                lost = self._dead_nodes_now()
                if lost or time.monotonic() >= deadline:
                    return lost
                if any((state.actors(actor_id=a) or {}).get("State") == "DEAD" for a in self._actor_ids):
                    return self._dead_nodes_now()  # once more: the node may have been declared dead meanwhile
            except Exception:  # noqa: BLE001 - no answer from the GCS: say nothing rather than guess
                return {}
            time.sleep(0.5)
        return {}

    def _dead_nodes_now(self) -> dict[str, list[int]]:
        import ray

        alive = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
        return {ip: [r for r, node in enumerate(self._nodes) if node == ip] for ip in sorted(set(self._nodes) - alive)}

    @staticmethod
    def _lost_node_note(lost: dict[str, list[int]]) -> str:
        return "".join(f"node {ip} is lost (Ray reports it dead): ranks {ranks} (MegatronRank) died; "
                       for ip, ranks in lost.items())

    def _shutdown_after_failure(self) -> None:
        """Shut down, bounded; a shutdown that cannot confirm every actor gone is logged, so that the
        error that ended the group (not this one) is what the caller sees."""
        try:
            self.shutdown()
        except Exception as error:  # noqa: BLE001
            logger.warning("trainer group shutdown after a failure: %s", error)


# what a gloo / NCCL collective reports when a peer rank's process (or node) went away
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET",
              "Connection refused", "NCCL communicator was aborted", "remote process exited")


def _reserve_nodes(layout: TrainerLayout, cpus_per_rank: float, timeout_s: float):
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
        raise MegatronGroupError(f"cannot place {what}: the Ray cluster has {len(alive)} node(s) alive "
                                 f"({', '.join(n['NodeManagerAddress'] for n in alive)})")
    group = placement_group([dict(bundle) for _ in range(layout.num_nodes)], strategy=strategy)
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        free = {f"{n['NodeManagerAddress']}": {k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU")}
                for n in alive}
        raise MegatronGroupError(f"cannot place {what} within {timeout_s:.0f}s (node resources: {free}; other "
                                 "actors may hold them)")
    return group


def _bundle(group, index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def _wait_actors_dead(actor_ids: list[str], timeout_s: float) -> set[str]:
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
