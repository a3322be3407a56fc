"""Forward/backward and forward-only passes over one rank's micro-batches, through Megatron's
pipeline schedule (get_forward_backward_func), so TP / PP / EP layouts all take the same path. The
optimizer step around forward_backward is rank_trainer.RankTrainer.train_step.

Loss scaling: a micro-batch's loss is sum(weights * per-token loss) with weights normalised over the
whole optimizer step by the driver. Megatron divides a 2-tuple loss by the number of micro-batches
(schedules.py:269) and DDP scales gradients by 1/DP (distributed_data_parallel.py:287), so the loss
handed back is multiplied by both: the gradient is then exactly that of the step's objective.

Non-finite steps: after backward, every rank checks its gradient buffers (and the last stage its
loss); one all-reduce over the world decides, so all ranks skip the optimizer step together."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.losses import policy_loss, value_loss
from lean_rl.backends.megatron.logprobs import _vocab_parallel_entropy, vocab_parallel_log_probs
from lean_rl.backends.megatron.optimizer_setup import grads_are_finite
from lean_rl.backends.megatron.routing_replay import (clear_routes, mismatch_counts, reset_mismatch,
                                                      set_micro_batch_routes)

@dataclass(frozen=True)
class StepContext:
    role: str  # "actor" | "critic"
    algorithm: AlgorithmConfig
    vocab_size: int
    temperature: float
    device: torch.device
    # the actor's loss: losses.policy_loss, or --custom-loss-function-path (algorithms/hooks.loss_function)
    loss_fn: Callable = policy_loss
    routing_replay: bool = False  # --use-rollout-routing-replay: micro-batches carry the engine's routes


def _inputs(micro_batch: dict[str, torch.Tensor], device: torch.device):
    tokens = micro_batch["tokens"].to(device)
    positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens).contiguous()
    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]  # position t predicts token t + 1
    return tokens, positions, targets


def log_probs_from_output(output: torch.Tensor, targets: torch.Tensor, ctx: StepContext,
                          entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) from vocab-parallel logits, with the sampling temperature applied.
    Entropy carries a gradient only when the loss uses it."""
    logits = output.float()
    if ctx.temperature != 1.0:
        logits = logits / ctx.temperature
    if entropy_grad:
        return vocab_parallel_log_probs(logits, targets, ctx.vocab_size, with_entropy=True)
    with torch.no_grad():
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        valid = max(0, min(logits.shape[-1], ctx.vocab_size - tp_rank * logits.shape[-1]))
        entropy = _vocab_parallel_entropy(logits.detach()[..., :valid])
    log_probs, _ = vocab_parallel_log_probs(logits, targets, ctx.vocab_size)  # may overwrite `logits`
    return log_probs, entropy


def _field(micro_batch, name, device):
    value = micro_batch.get(name)
    return None if value is None else value.to(device)


def _actor_loss(ctx: StepContext, micro_batch, targets, scale: float, output: torch.Tensor):
    algo = ctx.algorithm
    log_probs, entropy = log_probs_from_output(output, targets, ctx, entropy_grad=algo.entropy_coef != 0)
    get = partial(_field, micro_batch, device=ctx.device)
    loss, metrics = ctx.loss_fn(
        algo, log_probs=log_probs, advantages=get("advantages"), mask=get("mask"), weights=get("weights"),
        metric_weights=get("metric_weights"), old_log_probs=get("old_log_probs"),
        ref_log_probs=get("ref_log_probs"), rollout_log_probs=get("rollout_log_probs"), entropy=entropy)
    metrics["loss"] = loss.detach()
    return loss * scale, metrics


def _critic_loss(ctx: StepContext, micro_batch, targets, scale: float, output: torch.Tensor):
    values = output.float().squeeze(-1)
    get = partial(_field, micro_batch, device=ctx.device)
    per_token, clipped = value_loss(values, get("old_values"), get("returns"), ctx.algorithm.value_clip)
    loss = (get("weights") * per_token).sum()
    weights = get("metric_weights")
    metrics = {"loss": loss.detach(), "value_clipfrac": (weights * clipped).sum().detach(),
               "values": (weights * values.detach()).sum()}
    return loss * scale, metrics


def _micro_batch_train_forward(ctx: StepContext, scale: float, data_iterator, model):
    micro_batch = next(data_iterator)
    tokens, positions, targets = _inputs(micro_batch, ctx.device)
    set_micro_batch_routes(model, micro_batch, ctx.device)  # --use-rollout-routing-replay: the engine's experts
    output = model(tokens, positions, attention_mask=None)  # causal mask built by Megatron
    loss_fn = _actor_loss if ctx.role == "actor" else _critic_loss
    return output, partial(loss_fn, ctx, micro_batch, targets, scale)


def _sum_metrics(per_micro_batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    keys = sorted(per_micro_batch[0])
    return {key: torch.stack([m[key].float().cpu() for m in per_micro_batch]).sum() for key in keys}


def _world_any(flag: bool, device: torch.device) -> bool:
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def forward_backward(ddp, micro_batches: list[dict[str, torch.Tensor]], ctx: StepContext,
                     seq_length_hint: int) -> tuple[dict[str, float], bool]:
    """Forward and backward of this rank's micro-batches into DDP's (zeroed) gradient buffers.
    Returns the step's loss terms (on the last stage, summed over DP ranks: the driver's weights
    already normalised them; {} elsewhere) and whether every rank's loss and gradients are finite
    (the same answer on all ranks)."""
    ddp.train()
    scale = float(len(micro_batches) * parallel_state.get_data_parallel_world_size())
    reset_mismatch(ddp)
    try:
        per_micro_batch = get_forward_backward_func()(
            forward_step_func=partial(_micro_batch_train_forward, ctx, scale),
            data_iterator=iter(micro_batches),
            model=[ddp],
            num_microbatches=len(micro_batches),
            seq_length=seq_length_hint,
            micro_batch_size=int(micro_batches[0]["tokens"].shape[0]),
            forward_only=False,
        )
    finally:
        clear_routes(ddp)
    metrics: dict[str, torch.Tensor] = {}
    # fp16: the gradients are loss-scaled, and an overflow is the loss scaler's to judge (optimizer.step
    # refuses the step and lowers the scale); only the loss itself must be finite then
    finite = ddp.config.fp16 or grads_are_finite(ddp)
    mismatch = _routing_mismatch_frac(ddp, ctx.device) if ctx.routing_replay else None
    if parallel_state.is_pipeline_last_stage():
        metrics = _sum_metrics(per_micro_batch)
        names = sorted(metrics)
        packed = torch.stack([metrics[name] for name in names]).to(ctx.device)
        dist.all_reduce(packed, group=parallel_state.get_data_parallel_group())
        metrics = dict(zip(names, packed.cpu()))
        finite = finite and bool(torch.isfinite(packed).all())
    if mismatch is not None and metrics:
        metrics["routing_mismatch_frac"] = mismatch
    return {name: float(value) for name, value in metrics.items()}, not _world_any(not finite, ctx.device)


def _routing_mismatch_frac(model, device: torch.device) -> torch.Tensor:
    """Under routing replay: of the (token, MoE layer) routes replayed this step, the fraction where the
    router's own top-k differed from the engine's. Ranks count disjoint routes (DP and EP: other
    sequences; TP under sequence parallelism: other positions; PP: other layers), so the world sums them."""
    counts = mismatch_counts(model).to(device)
    dist.all_reduce(counts)
    return (counts[0].float() / counts[1].clamp(min=1).float()).cpu()


def _collect_forward(ctx: StepContext, targets, output: torch.Tensor, non_loss_data: bool = True):
    if ctx.role == "critic":
        return {"values": output.float().squeeze(-1).detach().cpu()}
    log_probs, _ = vocab_parallel_log_probs(output.float() / ctx.temperature if ctx.temperature != 1.0
                                            else output.float(), targets, ctx.vocab_size)
    return {"log_probs": log_probs.detach().cpu()}


def _micro_batch_forward(ctx: StepContext, data_iterator, model):
    micro_batch = next(data_iterator)
    tokens, positions, targets = _inputs(micro_batch, ctx.device)
    set_micro_batch_routes(model, micro_batch, ctx.device)
    output = model(tokens, positions, attention_mask=None)
    return output, partial(_collect_forward, ctx, targets)


def forward_only(model: torch.nn.Module, micro_batches: list[dict[str, torch.Tensor]], ctx: StepContext,
                 seq_length_hint: int) -> list[torch.Tensor] | None:
    """Per micro-batch [n, L] log-probs (actor) or values (critic), on the last pipeline stage's TP
    rank 0; None elsewhere."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            results = get_forward_backward_func()(
                forward_step_func=partial(_micro_batch_forward, ctx),
                data_iterator=iter(micro_batches),
                model=[model],
                num_microbatches=len(micro_batches),
                seq_length=seq_length_hint,
                micro_batch_size=int(micro_batches[0]["tokens"].shape[0]),
                forward_only=True,
                collect_non_loss_data=True,
            )
    finally:
        clear_routes(model)
        model.train(was_training)
    if not parallel_state.is_pipeline_last_stage() or parallel_state.get_tensor_model_parallel_rank() != 0:
        return None
    key = "values" if ctx.role == "critic" else "log_probs"
    return [result[key] for result in results]
