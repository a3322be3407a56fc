"""Per-token log-probs and entropy (and any other per-token statistic of the vocab distribution) from
the model's last hidden states, a chunk of tokens at a time, so that a long micro-batch never holds
its float32 [tokens x vocab / tp] logits at once (--logits-chunk-size).

Why: with SmolLM2's 49k vocabulary an 8k-token micro-batch has 1.6 GB of float32 logits, and the
unchunked path holds several tensors that size (the logits, the softmax inside the cross entropy,
the entropy's probabilities, their gradients). Here each chunk's logits are made from its hidden
states and the output weight, reduced to per-token values, and dropped; torch.utils.checkpoint keeps
only the chunk's inputs, and the backward recomputes that chunk's logits to get its gradients. The
values are those of logprobs.vocab_parallel_log_probs on the same logits (it is called per chunk).

Tensor parallel: the weight is this rank's vocab shard [V_padded / tp, h]; the reductions over the
vocabulary are logprobs.py's all-reduces, made per chunk (every TP rank runs the same chunks in the
same order, forward and recompute). The hidden states enter as ColumnParallelLinear's input does
(model_hooks.hidden_states_from_output_layer): each rank's gradient is that of its vocab shard only, so
it is summed over TP in the backward."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

from lean_rl.backends.megatron.logprobs import log_probs_and_entropy

# (float32 logits [n, V/tp] of a chunk, its per-token inputs...) -> per-token outputs [n] (None allowed)
ChunkStatistic = Callable[..., tuple[torch.Tensor | None, ...]]


def unwrapped(model: Any) -> Any:
    """This rank's GPTModel inside Megatron's DDP (or any wrapper with a `.module`)."""
    while hasattr(model, "module"):
        model = model.module
    return model


def output_weight(model: torch.nn.Module) -> torch.Tensor:
    """The vocabulary projection [V_padded / tp, h] of this rank's last stage, as GPTModel's
    _postprocess picks it (gpt_model.py:590): the shared word embeddings when tied."""
    gpt = unwrapped(model)
    if gpt.share_embeddings_and_output_weights:
        return gpt.shared_embedding_or_output_weight()
    return gpt.output_layer.weight


def chunked_token_statistics(hidden: torch.Tensor, weight: torch.Tensor, statistic: ChunkStatistic,
                             per_token: tuple[torch.Tensor, ...], chunk_size: int,
                             temperature: float = 1.0) -> tuple[torch.Tensor, ...]:
    """`statistic` of the float32 logits (hidden @ weight.T) / temperature, chunk_size tokens at a time.
    hidden: [..., h]; per_token: tensors [..., *] aligned with hidden's leading dims. Returns the
    statistic's outputs shaped like hidden's leading dims. With autograd on, each chunk is checkpointed:
    its logits are recomputed in the backward instead of kept."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead = hidden.shape[:-1]
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_inputs = [t.reshape(flat_hidden.shape[0], *t.shape[len(lead):]) for t in per_token]
    track = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)

    def one_chunk(h: torch.Tensor, w: torch.Tensor, *inputs: torch.Tensor):
        logits = torch.matmul(h, w.t()).float()  # as ColumnParallelLinear, then the consumers' .float()
        if temperature != 1.0:
            logits = logits / temperature
        return statistic(logits, *inputs)

    pieces = []
    for start in range(0, flat_hidden.shape[0], chunk_size):
        args = (flat_hidden[start:start + chunk_size], weight, *(t[start:start + chunk_size] for t in flat_inputs))
        if track:
            pieces.append(checkpoint(one_chunk, *args, use_reentrant=False, preserve_rng_state=False))
        else:
            pieces.append(one_chunk(*args))
    outputs = []
    for index, parts in enumerate(zip(*pieces)):
        if any(part is None for part in parts):
            raise ValueError(f"chunked_token_statistics: the statistic's output {index} is None for a chunk")
        outputs.append(torch.cat(parts).reshape(*lead, *parts[0].shape[1:]))
    return tuple(outputs)


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                      chunk_size: int, temperature: float = 1.0, entropy_grad: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target) [...], entropy [...]) in float32 from hidden [..., h] and targets [...]: the values
    of logprobs.vocab_parallel_log_probs on the full logits. The entropy carries a gradient only with
    entropy_grad (the loss uses it); the log-probs always do."""
    def statistic(logits, chunk_targets):
        return log_probs_and_entropy(logits, chunk_targets, vocab_size, entropy_grad)

    log_probs, entropy = chunked_token_statistics(hidden, weight, statistic, (targets,), chunk_size, temperature)
    return log_probs, entropy
