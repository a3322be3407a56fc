"""Forward-only passes over one rank's micro-batches (old / reference log-probs, critic values),
through Megatron's pipeline schedule (get_forward_backward_func), so TP / PP / EP layouts all take the
same path; and what the training pass (rank_trainer.py) shares with it: the step's context, the
inputs of a micro-batch, log-probs from the model's output."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Callable, ContextManager

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.distillation import topk_reverse_kl
from lean_rl.algorithms.losses import policy_loss
from lean_rl.backends.megatron.chunked_logprobs import chunked_log_probs, chunked_token_statistics, output_weight
from lean_rl.backends.megatron.model_hooks import hidden_states_from_output_layer
from lean_rl.backends.megatron.logprobs import (log_probs_and_entropy, vocab_parallel_log_probs,
                                                vocab_parallel_log_probs_at, vocab_parallel_top_k)
from lean_rl.backends.megatron.routing_replay import clear_routes, set_micro_batch_routes
from lean_rl.backends.megatron.vlm_batch import set_micro_batch_images


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
    # --logits-chunk-size: the actor's model hands back hidden states and log-probs are made this many
    # tokens at a time (chunked_logprobs.py); 0: from the model's full logits
    logits_chunk_size: int = 0

    @property
    def scores(self) -> bool:
        """The model ends in a value head (hidden -> 1): PPO's critic, or a reward model (--loss-type rm_loss)."""
        return self.role == "critic" or self.algorithm.scores_sequences

    @property
    def chunked(self) -> bool:
        return not self.scores and self.logits_chunk_size > 0


def inputs_of(micro_batch: dict[str, torch.Tensor], device: torch.device):
    tokens = micro_batch["tokens"].to(device)
    positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens).contiguous()
    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]  # position t predicts token t + 1
    return tokens, positions, targets


def model_output_mode(model: torch.nn.Module, ctx: StepContext) -> ContextManager:
    """The context a pass of the model runs in: its output is the hidden states when ctx.chunked."""
    return hidden_states_from_output_layer(model) if ctx.chunked else contextlib.nullcontext()


def _logits(output: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    """This rank's float32 logits at the sampling temperature (the unchunked path)."""
    logits = output.float()
    return logits / ctx.temperature if ctx.temperature != 1.0 else logits


def log_probs_from_output(output: torch.Tensor, targets: torch.Tensor, ctx: StepContext, entropy_grad: bool,
                          weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) from vocab-parallel logits, with the sampling temperature applied;
    with ctx.chunked `output` is the hidden states and `weight` the output layer's (chunked_logprobs.py).
    Entropy carries a gradient only when the loss uses it."""
    if ctx.chunked:
        if weight is None:
            raise ValueError("log_probs_from_output: chunked log-probs need the output layer's weight")
        return chunked_log_probs(output, weight, targets, ctx.vocab_size, ctx.logits_chunk_size,
                                 ctx.temperature, entropy_grad)
    return log_probs_and_entropy(_logits(output, ctx), targets, ctx.vocab_size, entropy_grad)


def teacher_top_kl_from_output(output: torch.Tensor, teacher_top_ids: torch.Tensor, teacher_top_log_probs: torch.Tensor,
                               ctx: StepContext, weight: torch.Tensor | None = None) -> torch.Tensor:
    """--opd-estimator topk: the reverse KL to the teacher over its top-K tokens plus a tail bucket, per
    token [n, L] (algorithms/distillation.topk_reverse_kl), differentiable, from vocab-parallel logits (or
    with ctx.chunked the hidden states, a chunk at a time). teacher_top_*: [n, L, K]. Leaves `output`
    unmodified: call it before log_probs_from_output, which may overwrite the logits."""
    def statistic(logits, ids, teacher):
        return (topk_reverse_kl(vocab_parallel_log_probs_at(logits, ids, ctx.vocab_size), teacher),)

    if ctx.chunked:
        if weight is None:
            raise ValueError("teacher_top_kl_from_output: chunked logits need the output layer's weight")
        (kl,) = chunked_token_statistics(output, weight, statistic, (teacher_top_ids, teacher_top_log_probs),
                                         ctx.logits_chunk_size, ctx.temperature)
        return kl
    return statistic(_logits(output, ctx), teacher_top_ids, teacher_top_log_probs)[0]


def field_of(micro_batch, name, device):
    value = micro_batch.get(name)
    return None if value is None else value.to(device)


def _collect_forward(ctx: StepContext, targets, weight, top_k: int, output: torch.Tensor, non_loss_data: bool = True):
    if ctx.scores:
        return {"values": output.float().squeeze(-1).detach().cpu()}
    if top_k:  # --opd-type megatron: the teacher's top-k at every position
        if ctx.chunked:
            ids, log_probs = chunked_token_statistics(
                output, weight, lambda logits: vocab_parallel_top_k(logits, top_k, ctx.vocab_size), (),
                ctx.logits_chunk_size, ctx.temperature)
        else:
            ids, log_probs = vocab_parallel_top_k(_logits(output, ctx), top_k, ctx.vocab_size)
        return {"top_k": (ids.cpu(), log_probs.detach().cpu())}
    if ctx.chunked:
        log_probs, _ = chunked_log_probs(output, weight, targets, ctx.vocab_size, ctx.logits_chunk_size,
                                         ctx.temperature)
    else:
        log_probs, _ = vocab_parallel_log_probs(_logits(output, ctx), targets, ctx.vocab_size)
    return {"log_probs": log_probs.detach().cpu()}


def _micro_batch_forward(ctx: StepContext, top_k: int, data_iterator, model):
    micro_batch = next(data_iterator)
    tokens, positions, targets = inputs_of(micro_batch, ctx.device)
    set_micro_batch_routes(model, micro_batch, ctx.device)
    set_micro_batch_images(model, micro_batch)  # a vision-language model's images (vlm_batch.py)
    output = model(tokens, positions, attention_mask=None)
    weight = output_weight(model) if ctx.chunked else None
    return output, partial(_collect_forward, ctx, targets, weight, top_k)


def forward_only(model: torch.nn.Module, micro_batches: list[dict[str, torch.Tensor]], ctx: StepContext,
                 seq_length_hint: int, top_k: int = 0) -> list | None:
    """Per micro-batch [n, L] log-probs (actor) or values (critic), or with top_k the k likeliest tokens
    at every position ([n, L, k] ids, [n, L, k] log-probs), on the last pipeline stage's TP rank 0;
    None elsewhere."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), model_output_mode(model, ctx):
            results = get_forward_backward_func()(
                forward_step_func=partial(_micro_batch_forward, ctx, top_k),
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
    key = "values" if ctx.scores else "top_k" if top_k else "log_probs"
    return [result[key] for result in results]
