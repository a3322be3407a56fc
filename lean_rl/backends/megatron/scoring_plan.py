"""Plan a log-prob request over data-parallel ranks and micro-batches (pure Python, driver side).

Every rank must run the same number of micro-batches of the same [micro_batch_size, seq_length]
shape: pipeline stages exchange fixed-shape activations, and MoE dispatchers exchange tokens across
data-parallel (expert) ranks on every micro-batch. So sequences go round-robin to DP ranks, every
rank gets padded with empty rows to the same count, and every row is right-padded to one length
(causal attention: padding after a token never changes its log-prob)."""

from __future__ import annotations

from dataclasses import dataclass

PAD_TOKEN_ID = 0  # any valid id: padded positions are never scored


@dataclass(frozen=True)
class ScoringBatch:
    """One DP rank's share. Rows beyond len(token_ids) are padding rows."""

    token_ids: tuple[tuple[int, ...], ...]
    score_from: tuple[int, ...]  # score tokens[score_from:] of each sequence
    seq_length: int
    micro_batch_size: int
    num_micro_batches: int
    # per sequence, its multimodal_train_inputs (vision-language models) or None; () when no sequence has images
    images: tuple = ()


@dataclass(frozen=True)
class ScoringPlan:
    batches: tuple[ScoringBatch, ...]  # indexed by DP rank
    owners: tuple[tuple[int, int], ...]  # request index -> (dp rank, row in that rank's batch)


def plan_scoring(token_ids: list[list[int]], score_from: list[int] | None, *, data_parallel_size: int,
                 micro_batch_size: int, vocab_size: int, max_seq_length: int, length_multiple: int = 1,
                 images: list | None = None) -> ScoringPlan:
    """Validate a request and split it. score_from[i] (default 1) is the index of the first token of
    sequence i whose log-prob is wanted; it must be >= 1 (token 0 has no context). images[i]: sequence
    i's image inputs ({"pixel_values", "image_grid_thw"}, a vision-language model's) or None."""
    if images is not None and len(images) != len(token_ids):
        raise ValueError(f"images has {len(images)} entries for {len(token_ids)} sequences")
    if not token_ids:
        raise ValueError("token_ids is empty")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    score_from = [1] * len(token_ids) if score_from is None else list(score_from)
    if len(score_from) != len(token_ids):
        raise ValueError(f"score_from has {len(score_from)} entries for {len(token_ids)} sequences")
    for i, (tokens, start) in enumerate(zip(token_ids, score_from)):
        if not 1 <= start <= len(tokens):
            raise ValueError(f"sequence {i}: score_from={start} must be in [1, {len(tokens)}]")
        if len(tokens) > max_seq_length:
            raise ValueError(f"sequence {i} has {len(tokens)} tokens, more than --seq-length {max_seq_length}")
        bad = [t for t in tokens if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"sequence {i}: token ids {bad[:5]} outside [0, --vocab-size {vocab_size})")
    longest = max(len(t) for t in token_ids)
    seq_length = -(-longest // length_multiple) * length_multiple
    shares: list[list[int]] = [[] for _ in range(data_parallel_size)]
    owners = []
    for i in range(len(token_ids)):
        rank = i % data_parallel_size
        owners.append((rank, len(shares[rank])))
        shares[rank].append(i)
    num_micro_batches = -(-max(len(s) for s in shares) // micro_batch_size)
    batches = tuple(
        ScoringBatch(token_ids=tuple(tuple(token_ids[i]) for i in share),
                     score_from=tuple(score_from[i] for i in share), seq_length=seq_length,
                     micro_batch_size=micro_batch_size, num_micro_batches=num_micro_batches,
                     images=tuple(images[i] for i in share) if images is not None else ())
        for share in shares)
    return ScoringPlan(batches=batches, owners=tuple(owners))


def micro_batch_image_rows(batch: ScoringBatch, index: int) -> list:
    """The image inputs (or None) of micro-batch `index`'s rows, in row order (padding rows: None)."""
    rows = range(index * batch.micro_batch_size, (index + 1) * batch.micro_batch_size)
    return [batch.images[row] if row < len(batch.images) else None for row in rows]


def micro_batch_rows(batch: ScoringBatch, index: int) -> list[tuple[int, ...]]:
    """Token rows of micro-batch `index`, right-padded to seq_length; empty rows are all padding."""
    rows = []
    for row in range(index * batch.micro_batch_size, (index + 1) * batch.micro_batch_size):
        tokens = batch.token_ids[row] if row < len(batch.token_ids) else ()
        rows.append(tuple(tokens) + (PAD_TOKEN_ID,) * (batch.seq_length - len(tokens)))
    return rows
