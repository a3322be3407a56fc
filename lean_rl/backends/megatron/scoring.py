"""Forward-only log-prob computation on one rank, through Megatron's pipeline schedule (works for
any TP / PP / EP layout; every rank of the world calls it with its DP share of the same plan)."""

from __future__ import annotations

from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from lean_rl.backends.megatron.logprobs import vocab_parallel_log_probs
from lean_rl.backends.megatron.scoring_plan import PAD_TOKEN_ID, ScoringBatch, micro_batch_image_rows, micro_batch_rows
from lean_rl.backends.megatron.vlm_batch import micro_batch_images, set_micro_batch_images


def _micro_batches(batch: ScoringBatch, device: torch.device):
    for index in range(batch.num_micro_batches):
        tokens = torch.tensor(micro_batch_rows(batch, index), dtype=torch.long, device=device)
        targets = torch.full_like(tokens, PAD_TOKEN_ID)
        targets[:, :-1] = tokens[:, 1:]  # position t predicts token t + 1
        positions = torch.arange(batch.seq_length, device=device).unsqueeze(0).expand_as(tokens).contiguous()
        yield tokens, positions, targets, micro_batch_images(micro_batch_image_rows(batch, index))


def _collect(targets: torch.Tensor, vocab_size: int, with_entropy: bool, output: torch.Tensor,
             non_loss_data: bool = True) -> dict[str, torch.Tensor]:
    log_probs, entropy = vocab_parallel_log_probs(output, targets, vocab_size, with_entropy)
    out = {"log_probs": log_probs.detach().cpu()}
    if entropy is not None:
        out["entropy"] = entropy.detach().cpu()
    return out


def _forward_step(vocab_size: int, with_entropy: bool, data_iterator, model):
    tokens, positions, targets, images = next(data_iterator)
    set_micro_batch_images(model, images)  # a vision-language model's images (none: text-only scoring)
    output = model(tokens, positions, attention_mask=None)  # causal mask built by Megatron
    return output, partial(_collect, targets, vocab_size, with_entropy)


def score_batch(model: torch.nn.Module, batch: ScoringBatch, vocab_size: int, device: torch.device,
                with_entropy: bool = False) -> list[dict[str, torch.Tensor]] | None:
    """Per sequence of `batch`: {"log_probs": [n - score_from]} (+ "entropy" of the distribution at
    each of those positions). Returned on the last pipeline stage; None on other stages."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            per_micro_batch = get_forward_backward_func()(
                forward_step_func=partial(_forward_step, vocab_size, with_entropy),
                data_iterator=_micro_batches(batch, device),
                model=[model],
                num_microbatches=batch.num_micro_batches,
                seq_length=batch.seq_length,
                micro_batch_size=batch.micro_batch_size,
                forward_only=True,
                collect_non_loss_data=True,
            )
    finally:
        model.train(was_training)
    if not parallel_state.is_pipeline_last_stage():
        return None
    results = []
    for row, (tokens, start) in enumerate(zip(batch.token_ids, batch.score_from)):
        chunk = per_micro_batch[row // batch.micro_batch_size]
        r = row % batch.micro_batch_size
        # the log-prob of token i sits at position i - 1
        results.append({key: value[r, start - 1:len(tokens) - 1].clone() for key, value in chunk.items()})
    return results
