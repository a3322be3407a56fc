"""One Megatron rank: the body of a Ray actor (MegatronGroup wraps it with ray.remote and calls
`call` on every rank in lockstep).

One entry point, `call(fn, *args)`, addressed by reference: `fn` is a method of this class
(MegatronRank.build_model), of its trainer (RankTrainer.train_step, hosted by setup_training) or of an
object the layer above hosts (RankWeightSync.send_stage: `attach` takes the class, so this package
never imports its user); the rank finds the hosted object of `fn`'s class and calls `fn` on it, so a
reader (and go-to-definition) follows the driver's call straight to the rank's code. Attached objects
read the model through the public accessors below (named_hf_tensors, weight_dtypes) and the rank's
layout, config and device.

Threads: Ray runs every method of a synchronous actor (max_concurrency=1, no async methods) on the
worker's main thread (checked on Ray 2.60: __init__ and all calls report MainThread), but threaded
or async actors run them elsewhere, and a TorchFunctionMode is thread-local. So `call` enters the
CUDA->CPU mode itself (compat_cpu.megatron_thread_mode; a no-op on CUDA and when already active)
instead of relying on one entered at start-up.

Checkpointing (issue 4): dist_checkpointing's saver starts a spawn-context multiprocessing Manager
whose child re-imports the parent's __main__; in a Ray worker that is ray/_private/workers/
default_worker.py, whose work is under `if __name__ == "__main__":`, so the child does not re-run
the worker (a spawn Manager started from an actor method works on Ray 2.60)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from lean_rl.backends.megatron import compat
from lean_rl.backends.megatron.compat_cpu import megatron_thread_mode
from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.distributed import (
    RankLayout,
    connect_rendezvous_store,
    destroy_distributed,
    init_distributed,
    open_rendezvous_store,
)
from lean_rl.backends.megatron.scoring_plan import ScoringBatch
from lean_rl.utils.coverage_data import save_coverage_data
from lean_rl.utils.net import service_host, set_socket_interface_env


class MegatronRank:
    """Methods run in lockstep on all ranks (the group calls them together, through `call`)."""

    def __init__(self, rank: int, world_size: int, config: MegatronConfig, device_type: str, seed: int,
                 num_threads: int, on_cluster: bool = False):
        if device_type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"rank {rank}: device 'cuda' requested but this process sees no GPU")
        self.rank, self.world_size, self.config, self.seed = rank, world_size, config, seed
        # on a Ray cluster, what this rank serves (the rendezvous store, a weight-update group) binds
        # its node's address, not loopback (utils.net.service_host)
        self.on_cluster = on_cluster
        self.socket_env: dict[str, str] = {}  # GLOO/NCCL_SOCKET_IFNAME in effect (set by init_distributed)
        self.device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        torch.set_num_threads(num_threads)
        # Megatron warns at import about every optional accelerator library it did not find (TE, Apex,
        # ...); each rank's copy would reach the driver's console. They say nothing actionable here.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        compat.apply_compat(self.device)
        self._store = None
        self.layout: RankLayout | None = None
        self.model: torch.nn.Module | None = None
        # hosted objects by class: RankTrainer (from setup_training) and whatever the layer above
        # attached (e.g. RankWeightSync); `call` finds the one a method belongs to
        self.hosted: dict[type, Any] = {}

    def call(self, fn: Callable, *args):
        """`fn(owner, *args)`: `fn` a public method of this class or of a hosted object's class."""
        if fn.__name__.startswith("_"):
            raise AttributeError(f"rank {self.rank}: {fn.__qualname__} is private")
        with megatron_thread_mode(self.device):
            return fn(self._owner_of(fn), *args)

    def _owner_of(self, fn: Callable) -> Any:
        owner = fn.__qualname__.rpartition(".")[0]
        for candidate in (self, *self.hosted.values()):
            cls = type(candidate)
            if cls.__qualname__ == owner and cls.__module__ == fn.__module__:
                return candidate
        hint = "setup_training() has not run" if owner == "RankTrainer" else f"attach({owner}) first"
        raise RuntimeError(f"rank {self.rank}: no {owner} on this rank for {fn.__qualname__} ({hint})")

    def attach(self, cls: Callable[["MegatronRank"], Any]) -> None:
        """Host `cls(self)` (once; later calls keep the first). It may define close()."""
        if cls not in self.hosted:
            self.hosted[cls] = cls(self)

    def pid(self) -> int:
        return os.getpid()

    def save_coverage(self) -> None:
        """Under scripts/cpu_coverage.py: write this rank's coverage data before ray.kill ends it."""
        save_coverage_data()

    def location(self) -> dict:
        """Where this rank runs: its node's address (as Ray knows it), its pid, its GPU ids, and (after
        init_distributed) the socket-interface settings gloo / NCCL were created with."""
        import ray

        return {"node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(), "socket_env": dict(self.socket_env),
                "gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()]}

    def open_rendezvous(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0 only: start the store server on this rank's service address; returns (host, port)
        for the other ranks to dial."""
        if self.rank != 0:
            raise RuntimeError(f"open_rendezvous called on rank {self.rank}; only rank 0 hosts the store")
        host = service_host(self.on_cluster)
        self._store, port = open_rendezvous_store(self.world_size, timeout_s, host)
        return host, port

    def init_distributed(self, host: str, port: int, timeout_s: float) -> RankLayout:
        # gloo / NCCL: the interface that holds the address this rank is reached at, before the
        # process groups exist (they read the environment when created)
        self.socket_env = set_socket_interface_env(service_host(self.on_cluster))
        store = self._store if self.rank == 0 else connect_rendezvous_store(port, self.world_size, timeout_s, host)
        self.layout = init_distributed(self.rank, self.world_size, store, self.config.parallel, self.device,
                                       self.seed, timeout_s)
        return self.layout

    def build_model(self) -> int:
        from lean_rl.backends.megatron.model import build_gpt_model
        from lean_rl.backends.megatron.vlm_model import build_vlm_model

        vlm = self.config.vlm_hf_config  # a vision-language checkpoint: GPTModel + the HF vision tower
        self.model = (build_gpt_model(self.config, self.device) if vlm is None else
                      build_vlm_model(self.config, vlm, self.device, self.config.freeze_vision_tower))
        if self.config.use_rollout_routing_replay:  # every router takes the engine's routes when given
            from lean_rl.backends.megatron.model_hooks import install_route_replay

            install_route_replay(self.model)
        return sum(p.numel() for p in self.model.parameters())

    def load_hf_checkpoint(self, checkpoint_dir: str, family: str) -> int:
        from lean_rl.backends.megatron.hf_weights.load import load_hf_weights
        from lean_rl.backends.megatron.vlm_weights import load_vlm_weights

        if self.config.vlm_hf_config is not None:
            return load_vlm_weights(self._require_weights(), checkpoint_dir, self.config)  # type: ignore[arg-type]
        return load_hf_weights(self._require_weights(), Path(checkpoint_dir), self.config, family)

    def compute_log_probs(self, batch: ScoringBatch, with_entropy: bool) -> list[dict[str, torch.Tensor]] | None:
        """Results on the last pipeline stage's TP rank 0; None elsewhere (nothing to ship twice)."""
        from lean_rl.backends.megatron.scoring import score_batch

        results = score_batch(self._require_weights(), batch, self.config.arch.vocab_size, self.device, with_entropy)
        return results if self.layout.tensor_rank == 0 else None

    def gather_hf_state_dict(self, family: str) -> dict[str, torch.Tensor] | None:
        from lean_rl.backends.megatron.hf_weights.export import gather_hf_state_dict
        from lean_rl.backends.megatron.vlm_weights import gather_vlm_hf_state_dict

        if self.config.vlm_hf_config is not None:
            return gather_vlm_hf_state_dict(self._require_weights(), self.config)  # type: ignore[arg-type]
        return gather_hf_state_dict(self._require_weights(), self.config, family, dst=0)

    # -- the weights as HF tensors, for objects attached by the layer above (weight sync) ------------

    def named_hf_tensors(self, family: str) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) for every tensor of this rank's pipeline stage, in a fixed order.
        Collective within the stage (TP / EP all-gathers): its ranks iterate together."""
        from lean_rl.backends.megatron.hf_weights.export import iter_stage_hf_tensors
        from lean_rl.backends.megatron.vlm_weights import iter_stage_vlm_hf_tensors

        if self.config.vlm_hf_config is not None:  # the tower's tensors, then the language model's
            return iter_stage_vlm_hf_tensors(self._require_weights(), self.config)  # type: ignore[arg-type]
        return iter_stage_hf_tensors(self._require_weights(), self.config, family)

    def named_hf_adapter_tensors(self, family: str) -> Iterator[tuple[str, torch.Tensor]]:
        """(PEFT name, tensor) of the LoRA adapters of this rank's pipeline stage (--lora-sync adapter)."""
        from lean_rl.backends.megatron.hf_weights.export import iter_stage_hf_adapter_tensors
        from lean_rl.backends.megatron.vlm_weights import iter_stage_vlm_hf_adapter_tensors

        if self.config.vlm_hf_config is not None:  # the language model's adapters (the tower has none)
            return iter_stage_vlm_hf_adapter_tensors(self._require_weights(), self.config)  # type: ignore[arg-type]
        return iter_stage_hf_adapter_tensors(self._require_weights(), self.config, family)

    def weight_dtypes(self) -> list[str]:
        """The dtypes of this rank's parameters ("float32", "bfloat16", ...)."""
        return sorted({str(p.dtype).removeprefix("torch.") for p in self._require_model().parameters()})

    # -- model-only checkpoints and full logits (issue 6: checkpoint conversion) -------------------

    def load_model_checkpoint(self, path: str, step: int | None) -> str:
        from lean_rl.backends.megatron.model_checkpoint import load_model_checkpoint

        return str(load_model_checkpoint(self._require_weights(), path, step, vocab_size=self.config.arch.vocab_size))

    def save_model_checkpoint(self, root: str, step: int, hf_config_dir: str | None) -> str:
        from lean_rl.backends.megatron.model_checkpoint import save_model_checkpoint

        return str(save_model_checkpoint(self._require_weights(), root, step, hf_config_dir))

    def compute_logits(self, token_ids: list[list[int]]) -> list[torch.Tensor] | None:
        """On the last stage's TP rank 0 of DP rank 0; None elsewhere."""
        from lean_rl.backends.megatron.logits import forward_logits

        logits = forward_logits(self._require_weights(), token_ids, self.config.arch.vocab_size, self.device)
        return logits if self.layout.tensor_rank == 0 and self.layout.data_rank == 0 else None

    # -- training: the rest is RankTrainer's (rank_trainer.py), called as RankTrainer.<method> ----------

    def setup_training(self, train_config, algorithm_config, role: str) -> None:
        """DDP + optimizer + LR schedule (critic: value head first). After HF weights are loaded."""
        from lean_rl.backends.megatron.rank_trainer import RankTrainer

        self.hosted[RankTrainer] = RankTrainer(self._require_model(), self.config, train_config, algorithm_config,
                                             role, self.device)

    def shutdown(self) -> None:
        for hosted in self.hosted.values():
            if hasattr(hosted, "close"):
                hosted.close()
        self.hosted = {}
        self.model = None
        destroy_distributed()

    def _require_model(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError(f"rank {self.rank}: build_model() has not run")
        return self.model

    def _require_weights(self) -> torch.nn.Module:
        """The model, for a call that reads its weights: refused while a hosted trainer has offloaded
        them (colocated on GPU their storages are 0 bytes; reading them raises or reads freed memory,
        review 2026-12-06 N4)."""
        model = self._require_model()
        if any(getattr(hosted, "offloaded", False) for hosted in self.hosted.values()):
            raise RuntimeError(f"rank {self.rank}: the weights are offloaded (colocated on GPU, the engines hold the "
                               "devices); onload() first")
        return model
