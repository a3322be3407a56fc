"""One Megatron rank: the body of a Ray actor (MegatronActorGroup wraps it with ray.remote).

Threads: Ray runs every method of a synchronous actor (max_concurrency=1, no async methods) on the
worker's main thread (checked on Ray 2.60: __init__ and all calls report MainThread), but threaded
or async actors run them elsewhere, and a TorchFunctionMode is thread-local. So each method enters
the CUDA->CPU mode itself (compat.megatron_thread_mode; a no-op on CUDA and when already active)
instead of relying on one entered at start-up.

Checkpointing (issue 4): dist_checkpointing's saver starts a spawn-context multiprocessing Manager
whose child re-imports the parent's __main__; in a Ray worker that is ray/_private/workers/
default_worker.py, whose work is under `if __name__ == "__main__":`, so the child does not re-run
the worker (a spawn Manager started from an actor method works on Ray 2.60)."""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from lean_rl.backends.megatron import compat
from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.distributed import (
    RankLayout,
    connect_rendezvous_store,
    destroy_distributed,
    init_distributed,
    open_rendezvous_store,
)
from lean_rl.backends.megatron.scoring_plan import ScoringBatch


def _on_megatron_thread(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with compat.megatron_thread_mode(self.device):
            return method(self, *args, **kwargs)

    return wrapper


class MegatronRankWorker:
    """Methods run in lockstep on all ranks (the group calls them together)."""

    def __init__(self, rank: int, world_size: int, config: MegatronConfig, device_type: str, seed: int,
                 num_threads: int):
        if device_type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"rank {rank}: device 'cuda' requested but this process sees no GPU")
        self.rank, self.world_size, self.config, self.seed = rank, world_size, config, seed
        self.device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        torch.set_num_threads(num_threads)
        # Megatron warns at import about every optional accelerator library it did not find (TE, Apex,
        # ...); each rank's copy would reach the driver's console. They say nothing actionable here.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        compat.apply_compat(self.device)
        self._store = None
        self.layout: RankLayout | None = None
        self.model: torch.nn.Module | None = None
        self.trainer = None  # rank_trainer.RankTrainer once setup_training() ran
        self._weight_sync = None  # lean_rl.weight_sync.rank.RankWeightSync, made on first use

    def pid(self) -> int:
        return os.getpid()

    def open_rendezvous(self, timeout_s: float) -> int:
        """Rank 0 only: start the store server; returns its port for the other ranks."""
        if self.rank != 0:
            raise RuntimeError(f"open_rendezvous called on rank {self.rank}; only rank 0 hosts the store")
        self._store, port = open_rendezvous_store(self.world_size, timeout_s)
        return port

    @_on_megatron_thread
    def init_distributed(self, port: int, timeout_s: float) -> RankLayout:
        store = self._store if self.rank == 0 else connect_rendezvous_store(port, self.world_size, timeout_s)
        self.layout = init_distributed(self.rank, self.world_size, store, self.config.parallel, self.device,
                                       self.seed, timeout_s)
        return self.layout

    @_on_megatron_thread
    def build_model(self) -> int:
        from lean_rl.backends.megatron.model import build_gpt_model

        self.model = build_gpt_model(self.config, self.device)
        return sum(p.numel() for p in self.model.parameters())

    @_on_megatron_thread
    def load_hf_checkpoint(self, checkpoint_dir: str, family: str) -> int:
        from lean_rl.backends.megatron.hf_weights.load import load_hf_weights

        return load_hf_weights(self._require_model(), Path(checkpoint_dir), self.config, family)

    @_on_megatron_thread
    def compute_log_probs(self, batch: ScoringBatch, with_entropy: bool) -> list[dict[str, torch.Tensor]] | None:
        """Results on the last pipeline stage's TP rank 0; None elsewhere (nothing to ship twice)."""
        from lean_rl.backends.megatron.scoring import score_batch

        results = score_batch(self._require_model(), batch, self.config.arch.vocab_size, self.device, with_entropy)
        return results if self.layout.tensor_rank == 0 else None

    @_on_megatron_thread
    def gather_hf_state_dict(self, family: str) -> dict[str, torch.Tensor] | None:
        from lean_rl.backends.megatron.hf_weights.export import gather_hf_state_dict

        return gather_hf_state_dict(self._require_model(), self.config, family, dst=0)

    # -- model-only checkpoints and full logits (issue 6: checkpoint conversion) -------------------

    @_on_megatron_thread
    def load_model_checkpoint(self, path: str, step: int | None) -> str:
        from lean_rl.backends.megatron.model_checkpoint import load_model_checkpoint

        return str(load_model_checkpoint(self._require_model(), path, step, vocab_size=self.config.arch.vocab_size))

    @_on_megatron_thread
    def save_model_checkpoint(self, root: str, step: int, hf_config_dir: str | None) -> str:
        from lean_rl.backends.megatron.model_checkpoint import save_model_checkpoint

        return str(save_model_checkpoint(self._require_model(), root, step, hf_config_dir))

    @_on_megatron_thread
    def compute_logits(self, token_ids: list[list[int]]) -> list[torch.Tensor] | None:
        """On the last stage's TP rank 0 of DP rank 0; None elsewhere."""
        from lean_rl.backends.megatron.logits import forward_logits

        logits = forward_logits(self._require_model(), token_ids, self.config.arch.vocab_size, self.device)
        return logits if self.layout.tensor_rank == 0 and self.layout.data_rank == 0 else None

    # -- training (issue 4): thin forwards to rank_trainer.RankTrainer ------------------------------

    @_on_megatron_thread
    def setup_training(self, train_config, algorithm_config, role: str) -> None:
        """DDP + optimizer + LR schedule (critic: value head first). After HF weights are loaded."""
        from lean_rl.backends.megatron.rank_trainer import RankTrainer

        self.trainer = RankTrainer(self._require_model(), self.config, train_config, algorithm_config, role,
                                   self.device)

    @_on_megatron_thread
    def train_step(self, micro_batches: list) -> dict | None:
        """Metrics on the last pipeline stage's TP rank 0 of DP rank 0; None elsewhere."""
        metrics = self._require_trainer().train_step(micro_batches)
        return metrics if self._reports() else None

    @_on_megatron_thread
    def forward_pass(self, micro_batches: list, reference: bool) -> list | None:
        return self._require_trainer().forward(micro_batches, reference)

    @_on_megatron_thread
    def snapshot_reference(self) -> None:
        self._require_trainer().snapshot_reference()

    @_on_megatron_thread
    def load_reference(self, checkpoint_dir: str) -> None:
        self._require_trainer().load_reference(checkpoint_dir)

    @_on_megatron_thread
    def save_checkpoint(self, root: str, step: int, extra_state: dict | None) -> str:
        return self._require_trainer().save_checkpoint(root, step, extra_state)

    @_on_megatron_thread
    def load_checkpoint(self, root: str, load_optimizer: bool, load_rng: bool, step: int | None = None) -> dict:
        return self._require_trainer().load_checkpoint(root, load_optimizer, load_rng, step)

    @_on_megatron_thread
    def offload(self) -> dict:
        return self._require_trainer().offload()

    @_on_megatron_thread
    def onload(self) -> dict:
        return self._require_trainer().onload()

    def _require_trainer(self):
        if getattr(self, "trainer", None) is None:
            raise RuntimeError(f"rank {self.rank}: setup_training() has not run")
        return self.trainer

    def _reports(self) -> bool:
        return self.layout.is_last_stage and self.layout.tensor_rank == 0 and self.layout.data_rank == 0

    @_on_megatron_thread
    def weight_sync_call(self, method: str, *args):
        """Weight sync to the SGLang engines: RankWeightSync.<method>(*args) (lean_rl/weight_sync/rank.py)."""
        from lean_rl.weight_sync.rank import RankWeightSync

        if self._weight_sync is None:
            self._weight_sync = RankWeightSync(self)
        return getattr(self._weight_sync, method)(*args)

    @_on_megatron_thread
    def shutdown(self) -> None:
        if self._weight_sync is not None:
            self._weight_sync.close()
        self.trainer = None
        self.model = None
        destroy_distributed()

    def _require_model(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError(f"rank {self.rank}: build_model() has not run")
        return self.model
