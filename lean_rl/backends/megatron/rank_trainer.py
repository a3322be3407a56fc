"""Everything one rank holds for training (rank side): the DDP-wrapped model, optimizer, LR
scheduler, reference weights, step counters, and the offloader. Hosted by the rank (setup_training);
the driver calls its methods on every rank by reference (group.call_each(RankTrainer.train_step, ...),
rank.MegatronRank.call). One optimizer step is train_step: forward_backward over the rank's
micro-batches (train_pass.py: Megatron's pipeline schedule, so TP / PP / EP layouts all take the same
path), then the optimizer. Forward-only passes are in forward_only.py, checkpoints in checkpoint.py.

Loss scaling: a micro-batch's loss is sum(weights * per-token loss) with weights normalised over the
whole optimizer step by the driver. Megatron divides a 2-tuple loss by the number of micro-batches
(schedules.py:269) and DDP scales gradients by 1/DP (distributed_data_parallel.py:287), so the loss
handed back is multiplied by both: the gradient is then exactly that of the step's objective.

Non-finite steps: after backward, every rank checks its gradient buffers (and the last stage its
loss); one all-reduce over the world decides, so all ranks skip the optimizer step together."""

from __future__ import annotations

import contextlib
import time
from typing import Any, ContextManager

import torch
from megatron.core import parallel_state

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.hooks import loss_function
from lean_rl.backends.megatron import checkpoint, lora
from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.forward_only import StepContext, forward_only
from lean_rl.backends.megatron.model_checkpoint import load_model_checkpoint
from lean_rl.backends.megatron.offload import HostBuffers, StorageOffloader
from lean_rl.backends.megatron.optimizer_setup import build_optimizer, current_lr
from lean_rl.backends.megatron.reference import ReferenceWeights
from lean_rl.backends.megatron.train_config import TrainConfig
from lean_rl.backends.megatron.train_pass import forward_backward
from lean_rl.backends.megatron.value_head import attach_value_head

ROLES = ("actor", "critic")


def _width(micro_batches: list[dict[str, torch.Tensor]]) -> int:
    return max(int(mb["tokens"].shape[1]) for mb in micro_batches)


def _as_tensors(micro_batches: list[dict]) -> list[dict[str, torch.Tensor]]:
    """The driver ships numpy arrays (read-only views of Ray's object store): copy into tensors."""
    return [{name: torch.tensor(value) for name, value in mb.items()} for mb in micro_batches]


class RankTrainer:
    def __init__(self, model: torch.nn.Module, config: MegatronConfig, train: TrainConfig,
                 algorithm: AlgorithmConfig, role: str, device: torch.device):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role == "critic" or algorithm.scores_sequences:  # PPO's critic, a reward model (--loss-type rm_loss)
            attach_value_head(model)
        lr = train.critic_lr if role == "critic" and train.critic_lr is not None else train.optimizer.lr
        self.model, self.role, self.device = model, role, device
        self.checkpoint_config = train.checkpoint
        if role == "actor" and train.lora.enabled:  # before DDP: it makes buffers for what trains only
            lora.add_adapters(model, train.lora, train.seed)
        self.bundle = build_optimizer(model, train.optimizer, lr,
                                      pipeline_parallel=config.parallel.pipeline_model_parallel_size > 1)
        # --custom-loss-function-path is imported here, on the rank: its module must be importable on
        # every trainer node (on one node the driver's PYTHONPATH and working directory reach the ranks)
        self.ctx = StepContext(role=role, algorithm=algorithm, vocab_size=config.arch.vocab_size,
                               temperature=train.temperature, device=device,
                               loss_fn=loss_function(algorithm) if role == "actor" else None,
                               routing_replay=config.use_rollout_routing_replay,
                               logits_chunk_size=train.logits_chunk_size)
        self.reference: ReferenceWeights | None = None
        self.teacher: ReferenceWeights | None = None  # --opd-type megatron: host copy, swapped in to score
        self.counters = {"optimizer_steps": 0, "skipped_steps": 0, "consecutive_skipped_steps": 0,
                         "loss_scale_overflows": 0}
        self._offloader: StorageOffloader | None = None
        self._host_buffers = HostBuffers()  # pinned buffers reused by every offload

    # -- training ---------------------------------------------------------------------------------

    def train_step(self, micro_batches: list[dict]) -> dict[str, float] | None:
        """One optimizer step over this rank's micro-batches (numpy, as the driver ships them), skipped
        on every rank when any saw a non-finite loss or gradient. Metrics (the loss terms summed over DP
        ranks, grad_norm, lr, skipped, counters) on the last stage's TP rank 0 of DP rank 0; None elsewhere."""
        self._require_onloaded()
        micro_batches = _as_tensors(micro_batches)
        start = time.perf_counter()
        ddp, optimizer = self.bundle.ddp, self.bundle.optimizer
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        metrics, finite = forward_backward(ddp, micro_batches, self.ctx, _width(micro_batches))
        update_successful = overflowed = False
        if finite:
            update_successful, grad_norm, _ = optimizer.step()
            # only fp16's loss scaler refuses: its scaled gradients overflowed, and it lowered the scale
            overflowed = not update_successful and self.model.config.fp16
            if not update_successful and not overflowed:
                raise RuntimeError("the optimizer refused a step with finite gradients")
        if update_successful:
            metrics.update(grad_norm=float(grad_norm) if grad_norm is not None else 0.0,
                           lr=current_lr(optimizer), skipped=0.0)
            self.bundle.scheduler.step(increment=1)
            self.counters["optimizer_steps"] += 1
            self.counters["consecutive_skipped_steps"] = 0
        else:
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            metrics.update(grad_norm=float("nan"), lr=current_lr(optimizer), skipped=1.0)
            self.counters["skipped_steps"] += 1
            if overflowed:  # the loss scale searching its level (fp16), not a broken step
                self.counters["loss_scale_overflows"] += 1
            else:
                self.counters["consecutive_skipped_steps"] += 1
        if self.device.type == "cuda":
            # the step's activations are freed but stay in the caching allocator: give them back before
            # a colocated sync re-maps the engines' weights beside this rank (review 2026-12-06 M4/N5)
            torch.cuda.empty_cache()
        metrics["step_time_s"] = time.perf_counter() - start  # this rank's forward/backward/step
        metrics.update({name: float(value) for name, value in self.counters.items()})
        reports = (parallel_state.is_pipeline_last_stage() and parallel_state.get_tensor_model_parallel_rank() == 0
                   and parallel_state.get_data_parallel_rank() == 0)
        return metrics if reports else None

    def forward(self, micro_batches: list[dict[str, torch.Tensor]], weights: str = "policy") -> list[torch.Tensor] | None:
        """Log-probs (actor; of the "reference" or "teacher" weights when `weights` says so) or values (critic)."""
        self._require_onloaded()
        micro_batches = _as_tensors(micro_batches)
        with self._weights(weights):
            return forward_only(self.model, micro_batches, self.ctx, _width(micro_batches))

    def teacher_top_k(self, micro_batches: list[dict[str, torch.Tensor]], k: int) -> list | None:
        """--opd-type megatron --opd-estimator topk: per micro-batch, the teacher's k likeliest tokens at
        every position, ([n, L, k] ids, [n, L, k] log-probs), on the last stage's TP rank 0; None elsewhere."""
        self._require_onloaded()
        micro_batches = _as_tensors(micro_batches)
        with self._weights("teacher"):
            return forward_only(self.model, micro_batches, self.ctx, _width(micro_batches), top_k=k)

    def _weights(self, weights: str) -> ContextManager:
        """The context a forward pass runs in: the policy's weights as they are, or the reference's or
        the teacher's swapped in for it (back, bit for bit, on exit)."""
        if weights == "policy":
            return contextlib.nullcontext()
        held = {"reference": self.reference, "teacher": self.teacher}[weights]
        if held is None:
            raise RuntimeError(f"{weights} log-probs requested but no {weights} weights were set (reference: "
                               "--ref-load, or the initial weights from --hf-checkpoint; teacher: --opd-teacher-load)")
        return held.swapped_in(self.model)

    def trainable_parameters(self) -> dict[str, int]:
        """{name: elements} of the parameters the optimizer steps (with LoRA: the adapters only)."""
        return lora.trainable_parameters(self.model)

    # -- reference model --------------------------------------------------------------------------

    def snapshot_reference(self) -> None:
        """The current weights become the reference (e.g. right after loading --hf-checkpoint)."""
        self.reference = ReferenceWeights(self.model)

    def load_reference(self, checkpoint_dir: str) -> None:
        """Reference = the model weights of a torch_dist checkpoint (--ref-load; a root with a tracker
        or an iteration directory). The policy weights are untouched."""
        self.reference = self._weights_of(checkpoint_dir)

    def load_teacher(self, checkpoint_dir: str) -> None:
        """--opd-type megatron: the teacher = the model weights of a torch_dist checkpoint
        (--opd-teacher-load), held in host memory as the reference's are."""
        self.teacher = self._weights_of(checkpoint_dir)

    def _weights_of(self, checkpoint_dir: str) -> ReferenceWeights:
        policy = ReferenceWeights(self.model)
        try:
            load_model_checkpoint(self.model, checkpoint_dir, vocab_size=self.ctx.vocab_size)
            return ReferenceWeights(self.model)
        finally:
            policy.copy_into(self.model)

    # -- checkpoints ------------------------------------------------------------------------------

    def save_checkpoint(self, root: str, step: int, extra_state: dict[str, Any] | None) -> str:
        self._require_onloaded()
        path = checkpoint.save_checkpoint(self.model, self.bundle.optimizer, self.bundle.scheduler, self.counters,
                                          root, step, extra_state, self.device,
                                          keep_last=self.checkpoint_config.keep_last_for(self.role))
        return str(path)

    def load_checkpoint(self, root: str, load_optimizer: bool, load_rng: bool, step: int | None = None) -> dict[str, Any]:
        self._require_onloaded()
        result = checkpoint.load_checkpoint(self.model, self.bundle.optimizer, self.bundle.scheduler, root,
                                            self.device, vocab_size=self.ctx.vocab_size,
                                            load_optimizer=load_optimizer, load_rng=load_rng, step=step)
        if result["loaded_optimizer"]:
            self.counters.update({k: int(v) for k, v in result["trainer_state"].items() if k in self.counters})
        return result

    # -- colocated memory -------------------------------------------------------------------------

    def offload(self) -> dict[str, Any]:
        """Release device memory (params, grads, optimizer state) while the engines generate. Only on
        a GPU: on CPU there is nothing to release and nothing is moved."""
        if self.device.type != "cuda":
            return {"offloaded": False, "reason": f"device is {self.device.type}"}
        self._require_onloaded()
        self._offloader = self._build_offloader()  # rebuilt: Adam creates its state at the first step
        released = self._offloader.offload()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return {"offloaded": True, "bytes": released}

    def onload(self) -> dict[str, Any]:
        if self._offloader is None or not self._offloader.offloaded:
            return {"onloaded": False}
        self._offloader.onload()
        torch.cuda.synchronize()
        return {"onloaded": True}

    def _build_offloader(self) -> StorageOffloader:
        ddp, optimizer = self.bundle.ddp, self.bundle.optimizer
        keep = [p for p in self.model.parameters()]
        for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
            for group in inner.optimizer.param_groups:
                keep.extend(group["params"])
            for state in inner.optimizer.state.values():
                keep.extend(v for v in state.values() if torch.is_tensor(v) and v.device.type == "cuda")
        buffers = ddp.buffers + ddp.expert_parallel_buffers
        keep.extend(b.param_data for b in buffers if b.param_data is not None)
        return StorageOffloader(keep=[t for t in keep if t.device.type == "cuda"],
                                discard=[b.grad_data for b in buffers], host_buffers=self._host_buffers)

    @property
    def offloaded(self) -> bool:
        """Its params, grads and optimizer state are in host memory (MegatronRank._require_weights reads it)."""
        return self._offloader is not None and self._offloader.offloaded

    def _require_onloaded(self) -> None:
        if self.offloaded:
            raise RuntimeError(f"{self.role} rank is offloaded; call onload() first")

