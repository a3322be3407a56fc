"""Driver side of the trainer: one Ray actor per Megatron rank (rank.MegatronRank), called in lockstep.
A MegatronGroup serves one model: the policy (role "actor") or PPO's value model (role "critic"), as
set up by setup_training; train_driver.py trains on a rollout with one or both.

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

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.distributed import RankLayout
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, check_arch_matches_checkpoint, hf_family
from lean_rl.backends.megatron.rank import MegatronRank
from lean_rl.backends.megatron.scoring_plan import plan_scoring
from lean_rl.backends.megatron.train_config import BatchPlan, TrainConfig, TrainerLayout
from lean_rl.utils.device import detect_device


class MegatronGroupError(RuntimeError):
    """A call failed or timed out on some rank; the group has been shut down."""


@dataclass(frozen=True)
class LogProbOutput:
    log_probs: list[torch.Tensor]  # per sequence: float32 [len - score_from]
    entropy: list[torch.Tensor] | None  # same shapes, when asked for


class MegatronGroup:
    def __init__(self, config: MegatronConfig, *, layout: TrainerLayout | None = None, world_size: int | None = None,
                 device: str | None = None, num_cpus_per_actor: float = 0.5, seed: int = 1234, num_threads: int = 1,
                 start_timeout_s: float = 300.0, call_timeout_s: float = 600.0, dist_timeout_s: float = 300.0):
        """Start one actor per rank, initialise torch.distributed + parallel_state on each and build
        the model (random weights). `layout`: as a run derived it at start-up (cfg.layout); a group
        used on its own gives `world_size` (default: the smallest world for the parallel layout) and
        `device` (default: utils.device.detect_device())."""
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
        self.family: str | None = None
        # set by setup_training: TrainConfig, AlgorithmConfig, and the model served: "actor" | "critic"
        self.train_config = None
        self.algorithm_config = None
        self.role: str | None = None
        self.batch_plan: BatchPlan | None = None
        self._actors: list[Any] = []
        self._pids: list[int] = []
        # Libraries configured through their only interface: gloo/NCCL pick the network interface
        # from these (loopback: all ranks are on this machine); OMP threads per rank.
        env = {"OMP_NUM_THREADS": str(num_threads), "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        actor_cls = ray.remote(MegatronRank).options(
            num_cpus=num_cpus_per_actor, num_gpus=1 if device == "cuda" else 0, max_restarts=0,
            max_concurrency=1, runtime_env={"env_vars": env})
        try:
            self._actors = [actor_cls.remote(rank, self.world_size, config, device, seed, num_threads)
                            for rank in range(self.world_size)]
            self._pids = self.call_all("pid", timeout_s=start_timeout_s)
            self.rendezvous_port: int = self._wait([self._actors[0].call.remote("open_rendezvous", dist_timeout_s)],
                                                   start_timeout_s, "open_rendezvous")[0]
            self.layouts: list[RankLayout] = self.call_all("init_distributed", self.rendezvous_port,
                                                           dist_timeout_s, timeout_s=start_timeout_s)
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
