"""Driver side of the trainer: one Ray actor per Megatron rank, called in lockstep.

Lifetime: actors are ordinary (non-detached) Ray actors owned by this driver, so Ray kills them when
the driver exits; any failed or timed-out call kills the whole group before the error propagates
(the other ranks would otherwise sit in a collective until the gloo/NCCL timeout), and shutdown()
waits for the actor processes to be gone. Every wait has a deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import psutil
import torch

from lean_rl.backends.megatron.actor import MegatronRankWorker
from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.distributed import RankLayout
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, check_arch_matches_checkpoint, hf_family
from lean_rl.backends.megatron.scoring_plan import plan_scoring


class MegatronGroupError(RuntimeError):
    """A call failed or timed out on some rank; the group has been shut down."""


@dataclass(frozen=True)
class LogProbOutput:
    log_probs: list[torch.Tensor]  # per sequence: float32 [len - score_from]
    entropy: list[torch.Tensor] | None  # same shapes, when asked for


class MegatronActorGroup:
    def __init__(self, config: MegatronConfig, *, world_size: int | None = None, device: str | None = None,
                 num_cpus_per_actor: float = 0.5, seed: int = 1234, num_threads: int = 1,
                 start_timeout_s: float = 300.0, call_timeout_s: float = 600.0, dist_timeout_s: float = 300.0):
        """Start world_size actors (default: the smallest world for the layout), initialise
        torch.distributed + parallel_state on each and build the model (random weights).
        device: "cpu" or "cuda"; default "cuda" when the Ray cluster has a GPU per rank."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("MegatronActorGroup needs a running Ray: call ray.init() first")
        self.config = config
        self.world_size = world_size if world_size is not None else config.parallel.min_world_size
        self.data_parallel_size = config.parallel.data_parallel_size(self.world_size)
        if device is None:
            device = "cuda" if ray.cluster_resources().get("GPU", 0) >= self.world_size else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.device = device
        self.call_timeout_s = call_timeout_s
        self.family: str | None = None
        # set by setup_training (issue 4): TrainConfig, AlgorithmConfig, "actor" | "critic"
        self.train_config = None
        self.algorithm_config = None
        self.role: str | None = None
        self._actors: list[Any] = []
        self._pids: list[int] = []
        # Libraries configured through their only interface: gloo/NCCL pick the network interface
        # from these (loopback: all ranks are on this machine); OMP threads per rank.
        env = {"OMP_NUM_THREADS": str(num_threads), "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        actor_cls = ray.remote(MegatronRankWorker).options(
            num_cpus=num_cpus_per_actor, num_gpus=1 if device == "cuda" else 0, max_restarts=0,
            max_concurrency=1, runtime_env={"env_vars": env})
        try:
            self._actors = [actor_cls.remote(rank, self.world_size, config, device, seed, num_threads)
                            for rank in range(self.world_size)]
            self._pids = self._call_all("pid", timeout_s=start_timeout_s)
            self.rendezvous_port: int = self._wait([self._actors[0].open_rendezvous.remote(dist_timeout_s)],
                                                   start_timeout_s, "open_rendezvous")[0]
            self.layouts: list[RankLayout] = self._call_all("init_distributed", self.rendezvous_port,
                                                            dist_timeout_s, timeout_s=start_timeout_s)
            self._call_all("build_model", timeout_s=start_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def from_hf_checkpoint(cls, checkpoint_dir: str | Path, parallel: ParallelConfig, *,
                           make_vocab_size_divisible_by: int = 128, seq_length: int | None = None,
                           **kwargs) -> "MegatronActorGroup":
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
        self._call_all("load_hf_checkpoint", str(Path(checkpoint_dir).resolve()), family)
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
        results = self._call_all_with("compute_log_probs", per_rank)
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
        return self._call_all("gather_hf_state_dict", self.family)[0]

    # -- model-only checkpoints and full logits (issue 6: checkpoint conversion) ---------------------

    def load_model_checkpoint(self, path: str | Path, step: int | None = None) -> Path:
        """Load the weights of a torch_dist checkpoint (model-only, e.g. from tools/convert_ckpt, or
        a full one) at this group's layout; `path` is a root (latest, or `step`) or one iter_* dir.
        Its hf_config/ folder, when present, sets the family (for gather_hf_state_dict)."""
        from lean_rl.convert.megatron_to_hf import resolve_checkpoint_dir

        directory = resolve_checkpoint_dir(Path(path).resolve(), step)
        self._call_all("load_model_checkpoint", str(directory), None)
        if (directory / "hf_config" / "config.json").is_file():
            self.family = hf_family(directory / "hf_config")
        return directory

    def save_model_checkpoint(self, root: str | Path, step: int, hf_config_dir: str | Path | None = None) -> Path:
        """Write the weights only ({"model": ...}, no optimizer) as ROOT/iter_{step:07d}."""
        hf_dir = None if hf_config_dir is None else str(Path(hf_config_dir).resolve())
        return Path(self._call_all("save_model_checkpoint", str(Path(root).resolve()), int(step), hf_dir)[0])

    def compute_logits(self, token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """float32 [len, vocab] logits per sequence (TP shards gathered, from the last stage)."""
        results = self._call_all("compute_logits", [list(t) for t in token_ids])
        return next(r for r in results if r is not None)

    # -- training (issue 4); orchestration in train_driver.py ------------------------------------

    def setup_training(self, train_config, algorithm_config, role: str = "actor") -> None:
        """Wrap every rank's model in Megatron DDP and build its optimizer and LR schedule (the critic
        gets its value head first: load HF weights before this). Validates the batch flags against
        the data-parallel size."""
        train_config.batch.check_data_parallel(self.data_parallel_size)
        self._call_all("setup_training", train_config, algorithm_config, role)
        self.train_config, self.algorithm_config, self.role = train_config, algorithm_config, role

    def initialize_for_training(self, train_config, algorithm_config, role: str = "actor",
                                actor_step: int = 0) -> tuple[int, dict | None]:
        """Weights, reference and optimizer from the flags (--load / --hf-checkpoint / --ref-load, or
        --critic-load for the critic, which resumes at `actor_step`, the step the actor resumed at);
        returns (step, extra_state) of a resumed checkpoint, else (0, None)."""
        from lean_rl.backends.megatron.train_driver import initialize_for_training

        return initialize_for_training(self, train_config, algorithm_config, role, actor_step)

    def train(self, groups: list, policy_version: int, critic: "MegatronActorGroup | None" = None) -> dict[str, float]:
        """Train on one rollout (groups of Samples): old / reference log-probs and critic values as
        the algorithm needs, advantages, then --num-steps-per-rollout optimizer steps. Returns
        metrics (train/loss, train/pg_clipfrac, train/kl_loss, train/entropy, train/grad_norm,
        train/lr, train/skipped_steps, rollout/..., critic/... for PPO)."""
        from lean_rl.backends.megatron.train_driver import train_on_rollout

        self._require_training()
        return train_on_rollout(self, groups, policy_version, critic)

    def save_checkpoint(self, root: str | Path, step: int, extra_state: dict | None = None) -> Path:
        """Model, optimizer, LR schedule, RNG, counters and `extra_state` (JSON-able, e.g. the
        DataBuffer's state_dict) as ROOT/iter_{step:07d}, published only once complete."""
        import json

        self._require_training()
        try:
            json.dumps(extra_state)
        except (TypeError, ValueError) as error:
            raise ValueError(f"save_checkpoint: extra_state is not JSON-serialisable ({error})") from error
        Path(root).mkdir(parents=True, exist_ok=True)
        return Path(self._call_all("save_checkpoint", str(Path(root).resolve()), int(step), extra_state)[0])

    def load_checkpoint(self, root: str | Path, step: int | None = None) -> tuple[int, dict | None]:
        """Restore the latest complete checkpoint under `root`, or that of `step` (any layout; a
        model-only checkpoint keeps a fresh optimizer). Returns (step, extra_state)."""
        from lean_rl.backends.megatron.checkpoint_paths import find_checkpoint

        self._require_training()
        find_checkpoint(root, step)  # fail here, not on every rank (which would take the group down)
        ckpt = self.train_config.checkpoint
        results = self._call_all("load_checkpoint", str(Path(root).resolve()), not ckpt.no_load_optim,
                                 not ckpt.no_load_rng, step)
        return results[0]["step"], results[0]["extra_state"]

    def offload(self) -> dict:
        """Colocated mode: free the trainer's GPU memory while the engines generate (no-op on CPU)."""
        return self._call_all("offload")[0]

    def onload(self) -> dict:
        return self._call_all("onload")[0]

    def _require_training(self) -> None:
        if self.train_config is None:
            raise RuntimeError("call setup_training() (or initialize_for_training()) first")

    def weight_sync_call(self, method: str, *args, timeout_s: float | None = None) -> list:
        """RankWeightSync.<method>(*args) on every rank, in lockstep (lean_rl/weight_sync); results in
        rank order."""
        return self._call_all("weight_sync_call", method, *args, timeout_s=timeout_s)

    def actor_pids(self) -> list[int]:
        return list(self._pids)

    def shutdown(self, wait_s: float = 30.0) -> None:
        """Kill every actor and wait (bounded) until their processes are gone. Idempotent."""
        import ray

        actors, self._actors = self._actors, []
        for actor in actors:
            ray.kill(actor, no_restart=True)
        processes = []
        for pid in self._pids:
            try:
                processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(processes, timeout=wait_s)
        if alive:
            raise MegatronGroupError(f"actor processes {[p.pid for p in alive]} still alive {wait_s}s after ray.kill")

    def __enter__(self) -> "MegatronActorGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- lockstep calls -------------------------------------------------------------------------

    def _call_all(self, method: str, *args, timeout_s: float | None = None) -> list:
        return self._call_all_with(method, [args] * len(self._actors), timeout_s)

    def _call_all_with(self, method: str, per_rank_args: Sequence[tuple], timeout_s: float | None = None) -> list:
        if not self._actors:
            raise MegatronGroupError(f"{method}: the actor group is shut down")
        refs = [getattr(actor, method).remote(*args) for actor, args in zip(self._actors, per_rank_args)]
        return self._wait(refs, self.call_timeout_s if timeout_s is None else timeout_s, method)

    def _wait(self, refs: list, timeout_s: float, what: str) -> list:
        """Results in rank order; the first failure (not the last) ends the wait and the group."""
        import ray

        deadline = time.monotonic() + timeout_s
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        while pending:
            left = deadline - time.monotonic()
            ready = ray.wait(list(pending), num_returns=1, timeout=max(left, 0))[0] if left > 0 else []
            if not ready:
                ranks = sorted(pending.values())
                self.shutdown()
                raise MegatronGroupError(f"{what}: ranks {ranks} did not finish within {timeout_s:.0f}s; "
                                         "group shut down")
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
                except Exception as error:
                    self.shutdown()
                    cause = getattr(error, "cause", None) or error  # RayTaskError wraps the rank's exception
                    raise MegatronGroupError(f"{what} failed on rank {rank} ({type(cause).__name__}: {cause}); "
                                             "group shut down") from error
        return results
