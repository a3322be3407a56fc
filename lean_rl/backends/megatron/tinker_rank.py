"""Tinker's training calls on one rank (lean_rl/tinker/service.py drives them through
group.call_all(RankTinker.<method>) after group.attach(RankTinker)).

Unlike RankTrainer.train_step, a forward_backward here neither zeroes nor steps: gradients accumulate
across calls until optim_step, which takes the client's Adam parameters for that step alone. Megatron's
forward_backward_func would finalize the gradients (the DP all-reduce, PP's tied embeddings) at the end
of every call; accumulated over several calls that would reduce earlier calls' sums again, so the
finalize is taken out of the passes and done once, in optim_step.

Losses are sums (algorithms/tinker_losses.py). Megatron divides a 2-tuple loss by the number of
micro-batches (schedules.py:269): the loss handed back is multiplied by it. DDP would scale by 1 / DP:
the server runs the trainer at DP 1 (service.py checks), every rank seeing every datum."""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Any, cast

import numpy as np
import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_model_config

from lean_rl.algorithms.tinker_losses import tinker_loss
from lean_rl.backends.megatron.adapter_slots import AdapterSlots
from lean_rl.backends.megatron.forward_only import StepContext, log_probs_from_output, model_output_mode
from lean_rl.backends.megatron.chunked_logprobs import output_weight
from lean_rl.backends.megatron.rank_trainer import RankTrainer

_LAYOUT = ("tokens", "targets", "mask")  # every other field of a micro-batch is a loss input


def _loss(ctx: StepContext, micro_batch: dict[str, torch.Tensor], loss: tuple[str, dict] | None, scale: float,
          weight, output: torch.Tensor):
    logp, _ = log_probs_from_output(output, micro_batch["targets"], ctx, entropy_grad=False, weight=weight)
    mask = micro_batch["mask"]
    if loss is None:  # forward() without the loss's inputs: log-probs only
        value = (logp * 0).sum()
    else:
        inputs = {k: v for k, v in micro_batch.items() if k not in _LAYOUT}
        value = tinker_loss(loss[0], logp, inputs, mask, loss[1])
    return value * scale, {"loss": value.detach().cpu(), "logprobs": (logp.detach() * mask).cpu()}


def _forward(ctx: StepContext, loss, scale: float, data_iterator, model):
    micro_batch = next(data_iterator)
    tokens = micro_batch["tokens"]
    positions = torch.arange(tokens.shape[1], device=ctx.device).unsqueeze(0).expand_as(tokens).contiguous()
    output = model(tokens, positions, attention_mask=None)
    weight = output_weight(model) if ctx.chunked else None
    return output, partial(_loss, ctx, micro_batch, loss, scale, weight)


class RankTinker:
    """Every call names the training client's adapter (adapter_slots.py: several share the actor)."""

    def __init__(self, rank):
        self.rank = rank
        self._slots: AdapterSlots | None = None

    @property
    def _trainer(self) -> RankTrainer:
        return self.rank.hosted[RankTrainer]

    def _use(self, adapter: str) -> None:
        if self._slots is None:
            self._slots = AdapterSlots(self._trainer.model, self._trainer.bundle.optimizer)
        self._slots.use(adapter)

    def drop(self, adapter: str) -> None:
        if self._slots is not None:
            self._slots.drop(adapter)

    def adapter_tensors(self, adapter: str, family: str) -> dict[str, torch.Tensor]:
        """{PEFT name: CPU tensor} of `adapter` on this rank's stage (collective within the stage's TP
        group); the driver joins the stages'."""
        self._use(adapter)
        return {name: t.detach().to("cpu", copy=True) for name, t in self.rank.named_hf_adapter_tensors(family)}

    def save_state(self, adapter: str, directory: str) -> None:
        """Write this rank's part of `adapter` (parameters, optimizer state) to directory/rank<N>.pt."""
        self._use(adapter)
        assert self._slots is not None
        torch.save(self._slots.checkpoint(adapter), os.path.join(directory, f"rank{torch.distributed.get_rank()}.pt"))

    def load_state(self, adapter: str, directory: str, optimizer: bool) -> None:
        """`adapter` becomes what save_state wrote to directory (the same trainer layout)."""
        self._use(adapter)
        assert self._slots is not None
        saved = torch.load(os.path.join(directory, f"rank{torch.distributed.get_rank()}.pt"), map_location="cpu",
                           weights_only=True)
        self._slots.restore(adapter, saved, optimizer)

    def forward_backward(self, adapter: str, micro_batches: list[dict[str, np.ndarray]], loss_fn: str | None,
                         loss_config: dict, forward_only: bool) -> tuple[list[np.ndarray], float] | None:
        """Per micro-batch the [n, L] log-probs of the targets (0 on padding) and the summed loss, on the
        last stage's TP rank 0 (None elsewhere); unless forward_only, the loss's gradients are added to
        those of the calls since the last optim_step."""
        self._use(adapter)
        trainer = self._trainer
        ctx = dataclasses.replace(trainer.ctx, temperature=1.0)  # Tinker trains and scores at T = 1
        batches = [{k: torch.as_tensor(v).to(ctx.device) for k, v in mb.items()} for mb in micro_batches]
        ddp = trainer.bundle.ddp
        config = get_model_config(ddp)
        finalize, config.finalize_model_grads_func = config.finalize_model_grads_func, None
        ddp.train(not forward_only)
        try:
            with model_output_mode(ddp, ctx), torch.set_grad_enabled(not forward_only):
                results = get_forward_backward_func()(
                    forward_step_func=partial(_forward, ctx, None if loss_fn is None else (loss_fn, loss_config),
                                              float(len(batches))),
                    data_iterator=iter(batches), model=[ddp], num_microbatches=len(batches),
                    seq_length=int(batches[0]["tokens"].shape[1]),
                    micro_batch_size=int(batches[0]["tokens"].shape[0]), forward_only=forward_only)
        finally:
            config.finalize_model_grads_func = finalize
            ddp.train()
        if not parallel_state.is_pipeline_last_stage() or parallel_state.get_tensor_model_parallel_rank() != 0:
            return None
        return [r["logprobs"].numpy() for r in results], float(sum(float(r["loss"]) for r in results))

    def optim_step(self, adapter: str, adam: dict[str, float]) -> dict[str, float] | None:
        """One Adam step on the gradients accumulated since the last one, with these parameters
        (learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm; 0: no clipping); then zero."""
        self._use(adapter)
        trainer = self._trainer
        ddp, optimizer = trainer.bundle.ddp, cast(Any, trainer.bundle.optimizer)  # a MegatronOptimizer
        finalize = get_model_config(ddp).finalize_model_grads_func
        if finalize is not None:
            finalize([ddp])
        for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
            inner.config.clip_grad = float(adam["grad_clip_norm"])
            for group in inner.optimizer.param_groups:
                group["lr"] = adam["learning_rate"] * group.get("lr_mult", 1.0)
                group["weight_decay"] = adam["weight_decay"] * group.get("wd_mult", 1.0)
                group["betas"] = (adam["beta1"], adam["beta2"])
                group["eps"] = adam["eps"]
        ok, grad_norm, _ = optimizer.step()
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        if not ok:
            raise RuntimeError("the optimizer refused the step (non-finite gradients)")
        trainer.counters["optimizer_steps"] += 1
        last = parallel_state.is_pipeline_last_stage() and parallel_state.get_tensor_model_parallel_rank() == 0
        return {"grad_norm": float(grad_norm or 0.0)} if last else None
