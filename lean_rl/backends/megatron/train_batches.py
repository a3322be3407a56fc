"""Turn one optimizer step's sequences into per-data-parallel-rank micro-batches (pure; driver side).

Rules every layout needs: all DP ranks run the same number of micro-batches (MoE dispatchers exchange
tokens across them on every micro-batch); rows of a micro-batch are right-padded to one length, a
multiple of `length_multiple` (TP size under sequence parallel); a sequence is never split.

- fixed (--micro-batch-size m): each DP rank gets an equal share, cut into micro-batches of m rows
  (sorted by length first, so rows of similar length share a micro-batch and padding stays small);
- dynamic (--use-dynamic-batch-size --max-tokens-per-gpu N): rows x padded length <= N per
  micro-batch, as few micro-batches as that allows, then split further so every rank has the same count;
- --balance-data: sequences go to DP ranks longest first, each to the rank with the fewest tokens so
  far (equal counts per rank in fixed mode); without it, sequence k goes to rank k mod DP.

Per-token fields arrive response-aligned, [B, T] over the whole batch (row i: sequence i's response
tokens from column 0; rollout_batch.py), or [B, T, K] with K values per token (the teacher's top-K),
and are laid out at the position that predicts the token: response token j of a sequence with prompt
length P sits at P-1+j. Floating fields become float32; integer ones (token ids) keep their type.

Routes (--use-rollout-routing-replay) are token-aligned instead: the engine's experts for token t sit
at position t (the router of position t routes token t), "routed_experts" [n, L, layers, topk];
NO_ROUTE where the engine had none (the last token, padding, tokens it never took as input), which the
routers route themselves (routing_replay.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.backends.megatron.vlm_batch import IMAGE_KEYS, micro_batch_images
from lean_rl.options import ConfigError
from lean_rl.routed_experts import NO_ROUTE

PAD_TOKEN_ID = 0  # any valid id: padded positions carry zero weight
ROUTES = "routed_experts"  # the micro-batch key of the replayed routes (routing_replay.py)
OPD_WEIGHTS = "opd_weights"  # --opd-estimator topk: --opd-kl-coef x the loss weights, beside teacher_top_*


@dataclass(frozen=True)
class Sequence:
    tokens: tuple[int, ...]
    prompt_length: int
    # the engine's routes of tokens[:-1], [len(tokens) - 1, layers x topk] int32 (None: none recorded)
    routed_experts: np.ndarray | None = field(default=None, compare=False, repr=False)
    # the sample's multimodal_train_inputs (vision-language models: vlm_batch.micro_batch_images)
    images: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def assign_to_ranks(lengths: list[int], data_parallel_size: int, balance: bool, equal_counts: bool) -> list[list[int]]:
    """Sequence indices per DP rank."""
    if not balance:
        return [list(range(rank, len(lengths), data_parallel_size)) for rank in range(data_parallel_size)]
    capacity = -(-len(lengths) // data_parallel_size) if equal_counts else len(lengths)
    heap = [(0, rank) for rank in range(data_parallel_size)]  # (tokens so far, rank)
    shares: list[list[int]] = [[] for _ in range(data_parallel_size)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        full = []
        while True:
            tokens, rank = heapq.heappop(heap)
            if len(shares[rank]) < capacity:
                break
            full.append((tokens, rank))
        shares[rank].append(index)
        heapq.heappush(heap, (tokens + lengths[index], rank))
        for item in full:
            heapq.heappush(heap, item)
    return [sorted(share) for share in shares]


def _fixed_micro_batches(share: list[int], lengths: list[int], micro_batch_size: int) -> list[list[int]]:
    ordered = sorted(share, key=lambda i: (-lengths[i], i))
    return [ordered[k:k + micro_batch_size] for k in range(0, len(ordered), micro_batch_size)]


def _packed_micro_batches(share: list[int], lengths: list[int], max_tokens: int, multiple: int) -> list[list[int]]:
    bins: list[list[int]] = []
    for index in sorted(share, key=lambda i: (-lengths[i], i)):
        padded = _round_up(lengths[index], multiple)
        if padded > max_tokens:
            raise ConfigError(f"a sequence of {lengths[index]} tokens does not fit --max-tokens-per-gpu {max_tokens}")
        # longest first: a bin's padded length is that of its first row
        if bins and (len(bins[-1]) + 1) * _round_up(lengths[bins[-1][0]], multiple) <= max_tokens:
            bins[-1].append(index)
        else:
            bins.append([index])
    return bins


def _split_to(bins: list[list[int]], count: int) -> list[list[int]]:
    """Split the bins with most rows until there are `count` (or every bin holds one row), then pad
    with empty bins."""
    bins = [list(b) for b in bins]
    while len(bins) < count:
        largest = max(range(len(bins)), key=lambda k: len(bins[k]), default=None)
        if largest is None or len(bins[largest]) < 2:
            break
        rows = bins.pop(largest)
        bins[largest:largest] = [rows[: len(rows) // 2], rows[len(rows) // 2:]]
    return bins + [[] for _ in range(count - len(bins))]


def plan_micro_batches(lengths: list[int], plan: BatchPlan, length_multiple: int = 1) -> list[list[list[int]]]:
    """[dp rank][micro-batch] -> sequence indices (an empty list is a padding micro-batch)."""
    if not lengths:
        raise ValueError("an optimizer step needs at least one sequence")
    batch, data_parallel_size, unit = plan.batch, plan.data_parallel_size, plan.micro_batch_unit
    fixed = unit is not None
    if fixed and len(lengths) % unit:
        raise ConfigError(f"{len(lengths)} sequences in an optimizer step is not a multiple of --micro-batch-size "
                          f"{batch.micro_batch_size} x data-parallel size {data_parallel_size}")
    shares = assign_to_ranks(lengths, data_parallel_size, batch.balance_data, equal_counts=fixed)
    if fixed:
        return [_fixed_micro_batches(share, lengths, batch.micro_batch_size) for share in shares]
    per_rank = [_packed_micro_batches(share, lengths, batch.max_tokens_per_gpu, length_multiple) for share in shares]
    count = max(1, max(len(bins) for bins in per_rank))
    return [_split_to(bins, count) for bins in per_rank]


def build_micro_batch(rows: list[int], sequences: list[Sequence], fields: dict[str, torch.Tensor],
                      length_multiple: int = 1, route_shape: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of one micro-batch, as the rank consumes them: "tokens" [n, L] int64, "sequence_index"
    [n] (-1: padding row), and every field ([B, T] or [B, T, K] response-aligned in, see above) as
    [n, L] or [n, L, K] at prediction positions (0 elsewhere). An empty `rows` gives one all-padding row of weight 0.
    With `route_shape` (layers, topk): also ROUTES [n, L, layers, topk] (token-aligned, see above)."""
    if not rows:
        length = _round_up(1, length_multiple)
        out = {"tokens": torch.full((1, length), PAD_TOKEN_ID, dtype=torch.long),
               "sequence_index": torch.tensor([-1])}
        out.update({name: _zeros(values, 1, length) for name, values in fields.items()})
        if route_shape is not None:
            out[ROUTES] = micro_batch_routes([], sequences, length, route_shape)
        return out
    length = _round_up(max(len(sequences[i].tokens) for i in rows), length_multiple)
    tokens = torch.full((len(rows), length), PAD_TOKEN_ID, dtype=torch.long)
    out = {name: _zeros(values, len(rows), length) for name, values in fields.items()}
    for r, i in enumerate(rows):
        seq = sequences[i]
        tokens[r, : len(seq.tokens)] = torch.tensor(seq.tokens, dtype=torch.long)
        start, response = seq.prompt_length - 1, seq.response_length
        for name, values in fields.items():
            if values.shape[1] < response:
                raise ValueError(f"field {name!r} has {values.shape[1]} values per row for the {response} "
                                 f"response tokens of sequence {i}")
            out[name][r, start:start + response] = values[i, :response]
    out["tokens"] = tokens
    out["sequence_index"] = torch.tensor(rows)
    if route_shape is not None:
        out[ROUTES] = micro_batch_routes(rows, sequences, length, route_shape)
    out.update(micro_batch_images([sequences[i].images for i in rows]))
    return out


def _zeros(field_values: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    dtype = torch.float32 if field_values.is_floating_point() else field_values.dtype
    return torch.zeros(rows, length, *field_values.shape[2:], dtype=dtype)


def micro_batch_routes(rows: list[int], sequences: list[Sequence], length: int,
                       route_shape: tuple[int, int]) -> torch.Tensor:
    """[max(1, n), length, layers, topk] int32: sequence rows[r]'s route of token t at [r, t], NO_ROUTE
    where it has none."""
    layers, topk = route_shape
    out = torch.full((max(1, len(rows)), length, layers, topk), NO_ROUTE, dtype=torch.int32)
    for r, i in enumerate(rows):
        known = sequences[i].routed_experts
        if known is None:
            continue
        if known.ndim != 2 or known.shape[0] != len(sequences[i].tokens) - 1 or known.shape[1] != layers * topk:
            raise ValueError(f"sequence {i}: routes of shape {tuple(known.shape)} for {len(sequences[i].tokens)} tokens; "
                             f"expected [{len(sequences[i].tokens) - 1}, {layers} layers x top-{topk}] (one row "
                             "per token but the last): does the engine serve this model?")
        out[r, :known.shape[0]] = torch.tensor(known).view(-1, layers, topk)
    return out


def response_values(micro_batch: dict[str, torch.Tensor], per_position: torch.Tensor,
                    sequences: list[Sequence]) -> dict[int, torch.Tensor]:
    """Inverse of the layout: {sequence index: [response_length] values} from a [n, L] result."""
    out = {}
    for r, i in enumerate(micro_batch["sequence_index"].tolist()):
        if i < 0:
            continue
        seq = sequences[i]
        out[i] = per_position[r, seq.prompt_length - 1: seq.prompt_length - 1 + seq.response_length].clone()
    return out


def pad_micro_batch(micro_batch: dict[str, torch.Tensor], rows: int, length: int) -> dict[str, torch.Tensor]:
    """Grow a micro-batch to [rows, length] with padding (token PAD_TOKEN_ID, field 0, index -1)."""
    n, current = micro_batch["tokens"].shape
    if (n, current) == (rows, length):
        return micro_batch
    if n > rows or current > length:
        raise ValueError(f"cannot pad a [{n}, {current}] micro-batch down to [{rows}, {length}]")
    out = {}
    for name, value in micro_batch.items():
        if name in IMAGE_KEYS:  # per image, not per token
            out[name] = value
            continue
        if name == "sequence_index":
            out[name] = torch.cat([value, torch.full((rows - n,), -1, dtype=value.dtype)])
            continue
        fill = PAD_TOKEN_ID if name == "tokens" else NO_ROUTE if name == ROUTES else 0
        grown = torch.full((rows, length, *value.shape[2:]), fill, dtype=value.dtype)
        grown[:n, :current] = value
        out[name] = grown
    return out


def uniform_shapes(by_rank: list[list[dict[str, torch.Tensor]]]) -> list[list[dict[str, torch.Tensor]]]:
    """Pad the k-th micro-batch of every DP rank to one shape. Needed where a collective assumes equal
    token counts across DP ranks: the MoE allgather dispatcher gathers over TP x EP
    (token_dispatcher.py:274) with equal-size all_gather."""
    out = [list(rank) for rank in by_rank]
    for k in range(len(out[0])):
        rows = max(int(rank[k]["tokens"].shape[0]) for rank in out)
        length = max(int(rank[k]["tokens"].shape[1]) for rank in out)
        for rank in out:
            rank[k] = pad_micro_batch(rank[k], rows, length)
    return out
