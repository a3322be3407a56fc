"""Driver side of the trainer: one Ray actor per Megatron rank (rank.MegatronRank), called in lockstep.
A MegatronGroup serves one model: the policy (role "actor") or PPO's value model (role "critic"), as
set up by setup_training; train_driver.py trains on a rollout with one or both.

How the ranks live on Ray (one placement-group bundle per trainer node, ranks numbered node by node,
where each runs, lockstep calls with deadlines, failures, node loss, shutdown) is rank_actors.py's
RankActors; this module is what they do: load and gather weights, score, checkpoint, train. With
`colocated` (--colocate on a cluster) the ranks take COLOCATED_RANK_SHARE of their devices and the
SGLang engines go into the same bundles (runtime.py)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.distributed import RankLayout
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, check_arch_matches_checkpoint, hf_family
from lean_rl.backends.megatron.rank import MegatronRank
from lean_rl.backends.megatron.rank_trainer import RankTrainer
from lean_rl.backends.megatron.rank_actors import RankActors
from lean_rl.backends.megatron.in_process_rank import InProcessRank
from lean_rl.backends.megatron.rank_errors import MegatronGroupError
from lean_rl.backends.megatron.rank_placement import COLOCATED_RANK_SHARE, place_ranks, rank_env
from lean_rl.backends.megatron.scoring_plan import plan_scoring
from lean_rl.backends.megatron.train_config import TrainConfig
from lean_rl.backends.megatron.trainer_layout import TrainerLayout
from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.utils.device import detect_device

# MegatronGroupError (defined in rank_errors.py): what a failed call raises; importable from here
__all__ = ["COLOCATED_RANK_SHARE", "LogProbOutput", "MegatronGroup", "MegatronGroupError"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogProbOutput:
    log_probs: list[torch.Tensor]  # per sequence: float32 [len - score_from]
    entropy: list[torch.Tensor] | None  # same shapes, when asked for


class MegatronGroup:
    def __init__(self, config: MegatronConfig, *, layout: TrainerLayout | None = None, world_size: int | None = None,
                 device: str | None = None, num_cpus_per_actor: float = 0.5, seed: int = 1234, num_threads: int = 1,
                 start_timeout_s: float = 300.0, call_timeout_s: float = 600.0, dist_timeout_s: float = 300.0,
                 colocated: bool = False, node_loss_wait_s: float = 45.0,
                 colocate_with: "MegatronGroup | None" = None, in_process: bool = False, placement_group=None):
        """Start one actor per rank, initialise torch.distributed + parallel_state on each and build
        the model (random weights). `layout`: as a run derived it at start-up (cfg.layout); a group
        used on its own gives `world_size` (default: the smallest world for the parallel layout) and
        `device` (default: utils.device.detect_device()). `colocated` (--colocate): the ranks take only
        COLOCATED_RANK_SHARE of their devices, leaving the rest of each node's bundle to the engines
        placed into it (sglang.engine_placement.colocated_placement). `colocate_with` (PPO's critic under --colocate):
        rank i runs in the bundle and on the devices of that group's rank i (place_ranks). `in_process`:
        one rank hosted in this process, no Ray (in_process_rank.InProcessRank; the GPU smoke check).
        `placement_group`: a trainer heal's, kept from the failed group (place_ranks). A colocated group's
        failure keeps its placement group: the engines live in it."""
        if not in_process:
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
        self.colocated = colocated
        self.cpus_per_rank = num_cpus_per_actor
        self._ranks = InProcessRank() if in_process else RankActors(node_loss_wait_s, keep_placement_on_failure=colocated)
        try:
            logger.info("starting %d Megatron-core rank(s) on %s (imports, model build, weights: ~10-30 s on CPU)",
                        self.world_size, device)
            place_ranks(self._ranks, MegatronRank,
                        lambda rank: (rank, self.world_size, config, device, seed, num_threads, layout.on_cluster),
                        layout, env=rank_env(device, num_threads, os.environ.get("PYTHONPATH")),
                        num_cpus_per_actor=num_cpus_per_actor, colocated=colocated,
                        colocate_with=None if colocate_with is None else colocate_with._ranks,
                        timeout_s=start_timeout_s, placement_group=placement_group)
            logger.info("trainer ranks on nodes %s, pids %s (rank i on the i-th)", self._ranks.nodes, self._ranks.pids)
            host, port = self._ranks.call_first(MegatronRank.open_rendezvous, dist_timeout_s, timeout_s=start_timeout_s)
            self.rendezvous_host: str = host
            self.rendezvous_port: int = port
            self.layouts: list[RankLayout] = self.call_all(MegatronRank.init_distributed, host, port, dist_timeout_s,
                                                           timeout_s=start_timeout_s)
            self.call_all(MegatronRank.build_model, timeout_s=start_timeout_s)
        except BaseException:
            self.shutdown(keep_placement=placement_group is not None)  # a heal's: it may try again in it
            raise

    @classmethod
    def from_hf_checkpoint(cls, checkpoint_dir: str | Path, parallel: ParallelConfig, *,
                           make_vocab_size_divisible_by: int = 128, seq_length: int | None = None,
                           params_dtype: str = "float32", **kwargs) -> "MegatronGroup":
        """A group whose architecture comes from the checkpoint's config.json, with its weights loaded
        (in `params_dtype`: MegatronConfig.params_dtype)."""
        arch = arch_from_hf_config(checkpoint_dir, make_vocab_size_divisible_by, seq_length)
        group = cls(MegatronConfig(arch=arch, parallel=parallel, params_dtype=params_dtype), **kwargs)
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
        self.call_all(MegatronRank.load_hf_checkpoint, str(Path(checkpoint_dir).resolve()), family)
        self.family = family

    def compute_log_probs(self, token_ids: Sequence[Sequence[int]], score_from: Sequence[int] | None = None, *,
                          micro_batch_size: int = 8, with_entropy: bool = False,
                          images: Sequence | None = None) -> LogProbOutput:
        """log p(tokens[i][j] | tokens[i][:j]) for j in [score_from[i], len(tokens[i])) (default
        score_from 1: every token but the first), split over DP ranks and micro-batches. `images[i]`:
        sequence i's image inputs (a vision-language model's multimodal_train_inputs) or None."""
        par = self.config.parallel
        plan = plan_scoring([list(t) for t in token_ids], None if score_from is None else list(score_from),
                            data_parallel_size=self.data_parallel_size, micro_batch_size=micro_batch_size,
                            vocab_size=self.config.arch.vocab_size, max_seq_length=self.config.arch.seq_length,
                            length_multiple=par.tensor_model_parallel_size if par.sequence_parallel else 1,
                            images=None if images is None else list(images))
        per_rank = [(plan.batches[layout.data_rank], with_entropy) for layout in self.layouts]
        results = self.call_each(MegatronRank.compute_log_probs, per_rank)
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
        return self.call_all(MegatronRank.gather_hf_state_dict, self.family)[0]

    # -- model-only checkpoints and full logits (issue 6: checkpoint conversion) ---------------------

    def load_model_checkpoint(self, path: str | Path, step: int | None = None) -> Path:
        """Load the weights of a torch_dist checkpoint (model-only, e.g. from tools/convert_ckpt, or
        a full one) at this group's layout; `path` is a root (latest, or `step`) or one iter_* dir.
        Its hf_config/ folder, when present, sets the family (for gather_hf_state_dict)."""
        from lean_rl.backends.megatron.checkpoint_paths import HF_CONFIG_DIR, find_checkpoint

        _, directory = find_checkpoint(Path(path).resolve(), step)
        self.call_all(MegatronRank.load_model_checkpoint, str(directory), None)
        if (directory / HF_CONFIG_DIR / "config.json").is_file():
            self.family = hf_family(directory / HF_CONFIG_DIR)
        return directory

    def save_model_checkpoint(self, root: str | Path, step: int, hf_config_dir: str | Path | None = None) -> Path:
        """Write the weights only ({"model": ...}, no optimizer) as ROOT/iter_{step:07d}."""
        hf_dir = None if hf_config_dir is None else str(Path(hf_config_dir).resolve())
        return Path(self.call_all(MegatronRank.save_model_checkpoint, str(Path(root).resolve()), int(step), hf_dir)[0])

    def compute_logits(self, token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """float32 [len, vocab] logits per sequence (TP shards gathered, from the last stage)."""
        results = self.call_all(MegatronRank.compute_logits, [list(t) for t in token_ids])
        return next(r for r in results if r is not None)

    # -- training: train_driver.py trains on a rollout through these and call_each(RankTrainer.<method>) --

    def setup_training(self, train_config: TrainConfig, algorithm_config, role: str = "actor",
                       batch_plan: BatchPlan | None = None) -> None:
        """Wrap every rank's model in Megatron DDP and build its optimizer and LR schedule (the critic
        gets its value head first: load HF weights before this). `batch_plan`: as a run derived it at
        start-up (cfg.batch_plan); a group used on its own derives it here from the batch flags.
        trainer_init.initialize_for_training does this from the flags."""
        plan = batch_plan or BatchPlan(train_config.batch, self.data_parallel_size)
        if plan.data_parallel_size != self.data_parallel_size:
            raise ValueError(f"batch plan for data-parallel size {plan.data_parallel_size}, group has "
                             f"{self.data_parallel_size}")
        self.call_all(MegatronRank.setup_training, train_config, algorithm_config, role)
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
        return Path(self.call_all(RankTrainer.save_checkpoint, str(Path(root).resolve()), int(step), extra_state)[0])

    def load_checkpoint(self, root: str | Path, step: int | None = None) -> tuple[int, dict | None]:
        """Restore the latest complete checkpoint under `root`, or that of `step` (any layout; a
        model-only checkpoint keeps a fresh optimizer). Returns (step, extra_state)."""
        from lean_rl.backends.megatron.checkpoint_paths import find_checkpoint

        self.require_training()
        find_checkpoint(root, step)  # fail here, not on every rank (which would take the group down)
        ckpt = self.train_config.checkpoint
        results = self.call_all(RankTrainer.load_checkpoint, str(Path(root).resolve()), not ckpt.no_load_optim,
                                not ckpt.no_load_rng, step)
        return results[0]["step"], results[0]["extra_state"]

    def trainable_parameters(self) -> dict[str, int]:
        """{name: elements} of what the optimizer steps (LoRA: the adapters), on rank 0's stage."""
        return self.call_all(RankTrainer.trainable_parameters)[0]

    def offload(self) -> dict:
        """Colocated mode: free the trainer's GPU memory while the engines generate (no-op on CPU)."""
        return self.call_all(RankTrainer.offload)[0]

    def onload(self) -> dict:
        return self.call_all(RankTrainer.onload)[0]

    def require_training(self) -> None:
        if self.train_config is None:
            raise RuntimeError("call setup_training() (or initialize_for_training()) first")

    # -- where the ranks run (rank_actors.RankActors), and engines beside them ----------------------

    def rank_pids(self) -> list[int]:
        """Per rank, its process id (on its own node: see rank_nodes)."""
        return list(self._ranks.pids)

    def rank_nodes(self) -> list[str]:
        """Per rank, the address of the Ray node it runs on."""
        return list(self._ranks.nodes)

    def rank_actor_ids(self) -> list[str]:
        """Per rank, its Ray actor id (hex), as in Ray's actor table."""
        return list(self._ranks.actor_ids)

    @property
    def placement_group(self):
        """The trainer's placement group: bundle k holds the ranks of trainer node k."""
        return self._ranks.placement_group

    @property
    def node_loss_wait_s(self) -> float:
        """How long a failure waits (at most) for Ray to tell whether a rank's node is lost."""
        return self._ranks.node_loss_wait_s

    @property
    def rank_gpu_ids(self) -> list[list[str]]:
        """Per rank, the GPU ids Ray gave it on its node (empty on CPU)."""
        return [[str(gpu) for gpu in ids] for ids in self._ranks.gpu_ids]

    def shutdown(self, wait_s: float = 30.0, keep_placement: bool = False) -> None:
        """Kill every rank and wait (bounded) until their processes are gone; then release the
        placement group, unless `keep_placement` (a heal's new group adopts it). Idempotent."""
        self._ranks.shutdown(wait_s, keep_placement=keep_placement)

    def __enter__(self) -> "MegatronGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- lockstep calls -------------------------------------------------------------------------

    def call_all(self, fn: Callable, *args, timeout_s: float | None = None) -> list:
        """`fn` with the same `args` on every rank, in lockstep; results in rank order. `fn` is a method
        by reference: of the rank (MegatronRank.build_model), of its trainer (RankTrainer.train_step)
        or of an attached object (RankWeightSync.setup; rank.MegatronRank.call). A failure or timeout
        on any rank shuts the group down and raises MegatronGroupError (rank_actors.py)."""
        return self._ranks.call_all(fn, *args, timeout_s=self.call_timeout_s if timeout_s is None else timeout_s)

    def attach(self, cls: Callable) -> None:
        """Every rank hosts `cls(rank)` (once), whose methods call_all then reaches (MegatronRank.attach)."""
        self.call_all(MegatronRank.attach, cls)

    def share(self, value):
        """`value` as an argument several ranks receive without a copy each (Ray's object store)."""
        return self._ranks.share(value)

    def call_each(self, fn: Callable, per_rank_args: Sequence[tuple], timeout_s: float | None = None) -> list:
        """As call_all, with one argument tuple per rank (rank order)."""
        return self._ranks.call_each(fn, per_rank_args, self.call_timeout_s if timeout_s is None else timeout_s)
