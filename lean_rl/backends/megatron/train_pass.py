"""One training pass of a rank (rank_trainer.RankTrainer.train_step runs it): forward and backward of
the rank's micro-batches through Megatron's pipeline schedule (so TP / PP / EP layouts all take the same
path) with the loss of the rank's role (the actor's policy loss, the critic's value loss, a reward
model's pair loss), the step's loss terms summed over DP ranks, and one world-wide answer to "is every
loss and gradient finite". Loss scaling: rank_trainer.py's docstring."""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from lean_rl.algorithms.losses import value_loss
from lean_rl.backends.megatron.chunked_logprobs import output_weight
from lean_rl.backends.megatron.forward_only import (StepContext, field_of, inputs_of, log_probs_from_output,
                                                    model_output_mode, teacher_top_kl_from_output)
from lean_rl.backends.megatron.optimizer_setup import grads_are_finite
from lean_rl.backends.megatron.routing_replay import (clear_routes, mismatch_counts, reset_mismatch,
                                                      set_micro_batch_routes)
from lean_rl.backends.megatron.train_batches import OPD_WEIGHTS
from lean_rl.backends.megatron.vlm_batch import set_micro_batch_images


def _actor_loss(ctx: StepContext, micro_batch, targets, scale: float, weight, output: torch.Tensor):
    algo = ctx.algorithm
    get = partial(field_of, micro_batch, device=ctx.device)
    distill_weights = get(OPD_WEIGHTS)  # --use-opd --opd-estimator topk: --opd-kl-coef x the loss weights
    if distill_weights is not None:  # before the log-probs, which may overwrite the logits
        teacher_kl = teacher_top_kl_from_output(output, get("teacher_top_ids"), get("teacher_top_log_probs"), ctx,
                                                weight)
    log_probs, entropy = log_probs_from_output(output, targets, ctx, entropy_grad=algo.entropy_coef != 0,
                                               weight=weight)
    loss, metrics = ctx.loss_fn(
        algo, log_probs=log_probs, advantages=get("advantages"), mask=get("mask"), weights=get("weights"),
        metric_weights=get("metric_weights"), old_log_probs=get("old_log_probs"),
        ref_log_probs=get("ref_log_probs"), rollout_log_probs=get("rollout_log_probs"), entropy=entropy)
    if distill_weights is not None:
        loss = loss + (distill_weights * teacher_kl).sum()
        metrics["opd_reverse_kl"] = (get("metric_weights") * teacher_kl).sum().detach()
    metrics["loss"] = loss.detach()
    return loss * scale, metrics


def _reward_model_loss(ctx: StepContext, micro_batch, targets, scale: float, weight, output: torch.Tensor):
    """--loss-type rm_loss: the value head's output on each row's one trained position is its score; the
    pair loss's coefficients come in `advantages` (algorithms/preference.pairwise_loss)."""
    get = partial(field_of, micro_batch, device=ctx.device)
    loss, metrics = ctx.loss_fn(ctx.algorithm, log_probs=output.float().squeeze(-1), advantages=get("advantages"),
                                mask=get("mask"))
    metrics["loss"] = loss.detach()
    return loss * scale, metrics


def _critic_loss(ctx: StepContext, micro_batch, targets, scale: float, weight, output: torch.Tensor):
    values = output.float().squeeze(-1)
    get = partial(field_of, micro_batch, device=ctx.device)
    per_token, clipped = value_loss(values, get("old_values"), get("returns"), ctx.algorithm.value_clip)
    loss = (get("weights") * per_token).sum()
    weights = get("metric_weights")
    metrics = {"loss": loss.detach(), "value_clipfrac": (weights * clipped).sum().detach(),
               "values": (weights * values.detach()).sum()}
    return loss * scale, metrics


def _micro_batch_train_forward(ctx: StepContext, scale: float, data_iterator, model):
    micro_batch = next(data_iterator)
    tokens, positions, targets = inputs_of(micro_batch, ctx.device)
    set_micro_batch_routes(model, micro_batch, ctx.device)  # --use-rollout-routing-replay: the engine's experts
    set_micro_batch_images(model, micro_batch)  # a vision-language model's images (vlm_batch.py)
    output = model(tokens, positions, attention_mask=None)  # causal mask built by Megatron
    loss_fn = _critic_loss if ctx.role == "critic" else _reward_model_loss if ctx.scores else _actor_loss
    weight = output_weight(model) if ctx.chunked else None  # the output is the hidden states
    return output, partial(loss_fn, ctx, micro_batch, targets, scale, weight)


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
        with model_output_mode(ddp, ctx):
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
