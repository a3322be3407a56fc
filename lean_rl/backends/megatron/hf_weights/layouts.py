"""How one Megatron parameter relates to its HF tensors, per TP rank: the shard math, in both
directions, on anything that slices like a tensor (a torch.Tensor or a safetensors slice, so a rank
reads only the rows/columns it owns). Pure torch; no Megatron, no process groups."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


class Sliceable(Protocol):
    def __getitem__(self, index) -> torch.Tensor: ...


class Layout(enum.Enum):
    REPLICATED = "replicated"  # every rank holds the whole tensor (norms, router)
    COLUMN = "column"  # dim 0 split over TP (ColumnParallelLinear weight / bias)
    ROW = "row"  # dim 1 split over TP (RowParallelLinear weight)
    VOCAB = "vocab"  # dim 0 padded to the padded vocab, then split over TP (embedding, output layer)
    QKV = "qkv"  # [q_g; k_g; v_g] per query group g, groups split over TP (linear_qkv)
    GATE_UP = "gate_up"  # [gate_r; up_r] on TP rank r (linear_fc1 of a SwiGLU MLP)
    GATE_UP_FUSED = "gate_up_fused"  # GATE_UP from one HF tensor [gate; up] (GLM-4's gate_up_proj)


@dataclass(frozen=True)
class Geometry:
    """The sizes the layouts need (from MegatronConfig)."""

    num_query_groups: int
    heads_per_group: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int


def shape_of(src: Sliceable) -> tuple[int, ...]:
    if isinstance(src, torch.Tensor):
        return tuple(src.shape)
    return tuple(src.get_shape())  # safetensors PySafeSlice


def _even_split(total: int, rank: int, size: int, what: str) -> tuple[int, int]:
    if total % size:
        raise ValueError(f"{what}: {total} rows/columns do not split evenly over {size} ranks")
    per = total // size
    return rank * per, (rank + 1) * per


def to_megatron_shard(layout: Layout, sources: Sequence[Sliceable], rank: int, size: int,
                      geometry: Geometry) -> torch.Tensor:
    """The shard that TP rank `rank` of `size` holds, built from the HF tensors `sources`
    (in the order of the rule's HF names)."""
    if layout is Layout.REPLICATED:
        return sources[0][:].contiguous()
    if layout is Layout.COLUMN:
        start, stop = _even_split(shape_of(sources[0])[0], rank, size, "column-parallel rows")
        return sources[0][start:stop].contiguous()
    if layout is Layout.ROW:
        start, stop = _even_split(shape_of(sources[0])[1], rank, size, "row-parallel columns")
        return sources[0][:, start:stop].contiguous()
    if layout is Layout.VOCAB:
        return _vocab_shard(sources[0], rank, size, geometry)
    if layout is Layout.QKV:
        return _qkv_shard(sources, rank, size, geometry)
    if layout is Layout.GATE_UP:
        gate, up = sources
        start, stop = _even_split(shape_of(gate)[0], rank, size, "gate/up rows")
        return torch.cat([gate[start:stop], up[start:stop]], dim=0).contiguous()
    if layout is Layout.GATE_UP_FUSED:
        half = shape_of(sources[0])[0] // 2
        start, stop = _even_split(half, rank, size, "gate/up rows")
        return torch.cat([sources[0][start:stop], sources[0][half + start:half + stop]], dim=0).contiguous()
    raise ValueError(f"unknown layout {layout}")


def to_hf_tensors(layout: Layout, shards: Sequence[torch.Tensor], geometry: Geometry) -> tuple[torch.Tensor, ...]:
    """Inverse of to_megatron_shard: the TP shards (in rank order) -> the HF tensors. From a single
    shard (TP 1) the result is views of it wherever the layout is a plain concatenation (torch.cat of
    one tensor is a full copy: at TP 1 a base100m weight sync spent ~70 ms of CPU on those copies);
    only QKV's per-group split moves rows, in one copy (qkv_blocks gives the same rows with none). So a
    caller that keeps the result past the parameter's next change, or writes into it, copies it first
    (gather_stage_tensors does; every transport reads it before its call returns)."""
    if layout is Layout.REPLICATED:
        return (shards[0],)
    if len(shards) == 1 and layout is not Layout.QKV:
        return _single_shard_views(layout, shards[0], geometry)
    if layout is Layout.COLUMN:
        return (torch.cat(list(shards), dim=0),)
    if layout is Layout.ROW:
        return (torch.cat(list(shards), dim=1),)
    if layout is Layout.VOCAB:
        return (torch.cat(list(shards), dim=0)[: geometry.vocab_size],)
    if layout is Layout.QKV:
        return _qkv_unshard(shards[0] if len(shards) == 1 else torch.cat(list(shards), dim=0), geometry)
    if layout is Layout.GATE_UP:
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return torch.cat([h[0] for h in halves], dim=0), torch.cat([h[1] for h in halves], dim=0)
    if layout is Layout.GATE_UP_FUSED:
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return (torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0),)
    raise ValueError(f"unknown layout {layout}")


def _single_shard_views(layout: Layout, shard: torch.Tensor, geometry: Geometry) -> tuple[torch.Tensor, ...]:
    """to_hf_tensors of one shard where no rows move: slices of it (contiguous, as dim 0 slices are)."""
    if layout is Layout.VOCAB:
        return (shard[: geometry.vocab_size],)
    if layout is Layout.GATE_UP:
        return tuple(shard.chunk(2, dim=0))
    return (shard,)  # COLUMN, ROW, GATE_UP_FUSED: the whole shard is the HF tensor


def hf_shapes(layout: Layout, megatron_shape: Sequence[int], geometry: Geometry) -> list[tuple[int, ...]]:
    """Shapes of the HF tensors that to_hf_tensors makes from a TP=1 parameter of `megatron_shape`
    (shape arithmetic only: planning a conversion allocates nothing)."""
    rows, *rest = megatron_shape
    if layout in (Layout.REPLICATED, Layout.COLUMN, Layout.ROW, Layout.GATE_UP_FUSED):
        return [tuple(megatron_shape)]
    if layout is Layout.VOCAB:
        return [(geometry.vocab_size, *rest)]
    if layout is Layout.QKV:
        groups = geometry.num_query_groups
        return [(groups * geometry.heads_per_group * geometry.head_dim, *rest), (groups * geometry.head_dim, *rest),
                (groups * geometry.head_dim, *rest)]
    if layout is Layout.GATE_UP:
        return [(rows // 2, *rest), (rows // 2, *rest)]
    raise ValueError(f"unknown layout {layout}")


def _vocab_shard(src: Sliceable, rank: int, size: int, geometry: Geometry) -> torch.Tensor:
    real_rows, *rest = shape_of(src)
    if real_rows != geometry.vocab_size:
        raise ValueError(f"vocab tensor has {real_rows} rows, config says --vocab-size {geometry.vocab_size}")
    start, stop = _even_split(geometry.padded_vocab_size, rank, size, "padded vocab rows")
    real_stop = min(stop, real_rows)
    parts = [src[start:real_stop]] if start < real_stop else []
    pad_rows = stop - max(start, real_stop)
    if pad_rows:  # padded rows stay zero; log-probs mask them out (logprobs.py)
        dtype = parts[0].dtype if parts else torch.float32
        parts.append(torch.zeros(pad_rows, *rest, dtype=dtype))
    return torch.cat(parts, dim=0).contiguous()


def _qkv_shard(sources: Sequence[Sliceable], rank: int, size: int, geometry: Geometry) -> torch.Tensor:
    # Megatron's linear_qkv output is viewed as [groups, (heads_per_group + 2) * head_dim]: each
    # query group's q heads, then its k head, then its v head; TP rank r owns a contiguous run of
    # groups, which is a contiguous row range of each of HF's q, k and v.
    q_src, k_src, v_src = sources
    if geometry.num_query_groups % size:
        raise ValueError(f"{geometry.num_query_groups} query groups do not split over {size} TP ranks")
    groups = geometry.num_query_groups // size
    first = rank * groups
    q_rows = geometry.heads_per_group * geometry.head_dim
    kv_rows = geometry.head_dim
    q = q_src[first * q_rows:(first + groups) * q_rows]
    k = k_src[first * kv_rows:(first + groups) * kv_rows]
    v = v_src[first * kv_rows:(first + groups) * kv_rows]
    rest = tuple(q.shape[1:])
    fused = torch.cat([q.reshape(groups, q_rows, *rest), k.reshape(groups, kv_rows, *rest),
                       v.reshape(groups, kv_rows, *rest)], dim=1)
    return fused.reshape(groups * (q_rows + 2 * kv_rows), *rest).contiguous()


def _qkv_unshard(fused: torch.Tensor, geometry: Geometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = (part.reshape(-1, *part.shape[2:]).contiguous() for part in _qkv_parts(fused, geometry))
    return q, k, v


def qkv_blocks(fused: torch.Tensor, geometry: Geometry) -> tuple[list[torch.Tensor], ...]:
    """HF's q, k and v of a fused QKV tensor (one TP shard at TP 1, or the shards concatenated), each as
    its query groups' row blocks in HF order: contiguous views of `fused`, no copy (torch.cat of each
    list is HF's tensor). A writer that takes the blocks one after another (the megatron->hf converter)
    moves QKV's rows without copying them: the split was 47 MB of copies in base100m's 292."""
    return tuple([part[group] for group in range(geometry.num_query_groups)] for part in _qkv_parts(fused, geometry))


def _qkv_parts(fused: torch.Tensor, geometry: Geometry) -> tuple[torch.Tensor, ...]:
    """q, k and v of a fused QKV tensor as (groups, rows, *rest) views of it."""
    q_rows = geometry.heads_per_group * geometry.head_dim
    kv_rows = geometry.head_dim
    grouped = fused.reshape(geometry.num_query_groups, q_rows + 2 * kv_rows, *fused.shape[1:])
    return torch.split(grouped, [q_rows, kv_rows, kv_rows], dim=1)
