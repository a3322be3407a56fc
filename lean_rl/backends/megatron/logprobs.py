"""Per-token log-probs (and entropy) from vocab-parallel logits, in float32, differentiable.

Padded vocab rows (MegatronConfig.padded_vocab_size > vocab_size) produce real logits (0 for the
zero rows the loader writes, anything after training), which would enter the softmax normaliser;
they are masked to -inf before Megatron's unfused vocab_parallel_cross_entropy, whose custom
backward then gives them zero gradient. The fused variant torch.compiles on first use and casts
gradients to bf16 (fused_cross_entropy.py:81), so it is not used."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def real_vocab_columns(partition: int, vocab_size: int) -> int:
    """How many of this TP rank's `partition` logit columns are real vocabulary (the rest pad it to
    MegatronConfig.padded_vocab_size; a late rank may hold padding only)."""
    return max(0, min(partition, vocab_size - parallel_state.get_tensor_model_parallel_rank() * partition))


def log_probs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                          entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy), both float32 [...]; the entropy carries a gradient only with
    `entropy_grad` (when the loss uses it). May overwrite `logits` (vocab_parallel_log_probs)."""
    if entropy_grad:
        log_probs, entropy = vocab_parallel_log_probs(logits, targets, vocab_size, with_entropy=True)
        assert entropy is not None
        return log_probs, entropy
    with torch.no_grad():
        entropy = _vocab_parallel_entropy(logits.detach()[..., :real_vocab_columns(logits.shape[-1], vocab_size)])
    log_probs, _ = vocab_parallel_log_probs(logits, targets, vocab_size)
    return log_probs, entropy


def vocab_parallel_log_probs(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                             with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [..., V_padded / tp] on this TP rank (GPTModel with parallel_output=True);
    targets: [...] token ids < vocab_size. Returns (log p(target) [...], entropy [...] or None), float32.
    When the vocab is not padded and no entropy is asked for, `logits` (if float32) is overwritten:
    Megatron's cross entropy works in place to save memory."""
    partition = logits.shape[-1]
    valid = real_vocab_columns(partition, vocab_size)
    logits = logits.float()
    entropy = _vocab_parallel_entropy(logits[..., :valid]) if with_entropy else None
    if valid < partition:
        padded = torch.arange(partition, device=logits.device) >= valid
        ce_input = logits.masked_fill(padded, float("-inf"))
    else:
        ce_input = logits.clone() if with_entropy else logits
    log_probs = -vocab_parallel_cross_entropy(ce_input, targets)
    return log_probs, entropy


def _shifted_and_log_z(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's logits shifted by the global max over TP, log Z of the shifted logits over the whole
    vocabulary [...]); `logits` holds only real vocab columns (possibly none on a rank that owns only
    padding). Differentiable in `logits` (the max is a constant)."""
    group = parallel_state.get_tensor_model_parallel_group()
    if logits.shape[-1]:
        local_max = logits.detach().max(dim=-1).values
    else:
        local_max = torch.full(logits.shape[:-1], float("-inf"), dtype=logits.dtype, device=logits.device)
    dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - local_max.unsqueeze(-1)
    # all-reduce SUM forward, identity backward: each rank's partial sums feed one replicated value.
    return shifted, reduce_from_tensor_model_parallel_region(shifted.exp().sum(dim=-1)).log()


def _vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = log Z - sum_v p_v * l_v, with l shifted by the global max; `logits` holds only real vocab
    columns (possibly none on a rank that owns only padding)."""
    shifted, log_z = _shifted_and_log_z(logits)
    probs = (shifted - log_z.unsqueeze(-1)).exp()
    return log_z - reduce_from_tensor_model_parallel_region((probs * shifted).sum(dim=-1))


def vocab_parallel_log_probs_at(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log p(v) for the K token ids in `ids` [..., K] (< vocab_size) from this TP rank's logits
    [..., V_padded / tp]: [..., K] float32, differentiable (on-policy distillation's top-k, --opd-estimator
    topk). Each id lives on one rank: its logit is picked there, 0 elsewhere, and summed over TP; the
    normaliser log Z is the all-reduced one of _vocab_parallel_entropy. Does not modify `logits`."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    partition = logits.shape[-1]
    valid = real_vocab_columns(partition, vocab_size)
    real = logits.float()[..., :valid]
    shifted, log_z = _shifted_and_log_z(real)
    local = ids.long() - tp_rank * partition
    here = (local >= 0) & (local < valid)
    if valid:
        picked = shifted.gather(-1, local.clamp(0, valid - 1)) * here
    else:
        picked = torch.zeros(ids.shape, dtype=real.dtype, device=real.device)
    return reduce_from_tensor_model_parallel_region(picked) - log_z.unsqueeze(-1)


def vocab_parallel_top_k(logits: torch.Tensor, k: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k likeliest token ids of each position and their log-probs, likeliest first, from this TP
    rank's logits [..., V_padded / tp]: ([..., k] int64, [..., k] float32), no gradient (the teacher's,
    --opd-type megatron). Each rank's own top-k of its real columns, gathered over TP, and the top-k of
    those; log Z is all-reduced as in _vocab_parallel_entropy."""
    group = parallel_state.get_tensor_model_parallel_group()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    partition = logits.shape[-1]
    valid = real_vocab_columns(partition, vocab_size)
    if k > vocab_size:
        raise ValueError(f"--opd-top-k {k} is more than the vocabulary's {vocab_size} tokens")
    with torch.no_grad():
        shifted, log_z = _shifted_and_log_z(logits.float()[..., :valid])
        log_z = log_z.unsqueeze(-1)
        width = min(k, valid)
        values, ids = shifted.topk(width, dim=-1) if width else (shifted[..., :0], shifted[..., :0].long())
        pad = k - width  # a rank with fewer real columns than k: -inf entries that never win
        values = torch.cat([values, values.new_full((*values.shape[:-1], pad), float("-inf"))], -1)
        ids = torch.cat([ids + tp_rank * partition, ids.new_zeros((*ids.shape[:-1], pad))], -1)
        world = dist.get_world_size(group)
        if world > 1:
            every_values, every_ids = [torch.empty_like(values) for _ in range(world)], [torch.empty_like(ids) for _ in range(world)]
            dist.all_gather(every_values, values.contiguous(), group=group)
            dist.all_gather(every_ids, ids.contiguous(), group=group)
            values, ids = torch.cat(every_values, -1), torch.cat(every_ids, -1)
        top_values, position = values.topk(k, dim=-1)
        return ids.gather(-1, position), top_values - log_z
