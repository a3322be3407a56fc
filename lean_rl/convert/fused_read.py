"""HF -> Megatron at TP 1: every tensor read straight into place.

to_megatron_shard builds QKV (per query group: its q heads, its k head, its v head), gate/up (gate rows,
then up rows) and the padded vocabulary with torch.cat of freshly read HF tensors: a second pass over
those bytes (~0.11 s of a base100m conversion's ~0.9 s of CPU, cProfile). The converter writes TP-1 chunks
only, and each piece of such a tensor is a contiguous row range of one HF tensor landing in a contiguous
row range of the Megatron one, so here every piece is read with os.preadv into its final place (the
unfused layouts, whole at TP 1, are one such piece). Same bytes as to_megatron_shard(layout, sources, 0,
1, geometry) (tests/unit/test_convert_io.py); a dtype change is left to it."""

from __future__ import annotations

import os

import torch

from lean_rl.backends.megatron.hf_weights.layouts import Geometry, Layout
from lean_rl.convert.reused_buffer import Empty, fresh_tensor
from lean_rl.convert.safetensors_io import CheckpointError, TensorInfo


def read_rows_into(info: TensorInfo, first_row: int, dest: torch.Tensor) -> None:
    """Rows [first_row, first_row + dest.shape[0]) of the stored tensor into `dest` (contiguous, its dtype)."""
    nbytes = dest.numel() * dest.element_size()
    if nbytes == 0:
        return
    row_bytes = info.nbytes // (info.shape[0] if info.shape else 1)  # a 0-d tensor: one row
    if (first_row * row_bytes + nbytes > info.nbytes or not dest.is_contiguous()
            or dest.dtype != info.dtype):  # the callers' shapes were checked against the headers: a bug if hit
        raise ValueError(f"{info.name}: rows {first_row}.. do not fit {list(dest.shape)} {dest.dtype}")
    view = dest.reshape(-1).view(torch.uint8).numpy().data.cast("B")
    start = info.begin + first_row * row_bytes
    fd = os.open(info.path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], start + done)
            if n == 0:
                raise CheckpointError(f"{info.path}: truncated while reading {info.name}")
            done += n
    finally:
        os.close(fd)


# At TP 1 these layouts are the HF tensor itself (GATE_UP_FUSED: [gate; up] is already Megatron's order).
_WHOLE = (Layout.REPLICATED, Layout.COLUMN, Layout.ROW, Layout.GATE_UP_FUSED)


def read_tp1(layout: Layout, infos: list[TensorInfo], geometry: Geometry, dtype: torch.dtype,
             empty: Empty = fresh_tensor) -> torch.Tensor | None:
    """The TP-1 Megatron tensor of `layout`, read into place in a tensor from `empty`; None where
    to_megatron_shard must make it (a dtype change, a vocabulary of the wrong size: its error message)."""
    if any(info.dtype != dtype for info in infos):
        return None
    if layout in _WHOLE:
        (whole,) = infos
        out = empty(whole.shape, dtype)
        read_rows_into(whole, 0, out)
        return out
    if layout is Layout.GATE_UP:
        gate, up = infos
        out = empty((gate.shape[0] + up.shape[0], *gate.shape[1:]), dtype)
        read_rows_into(gate, 0, out[:gate.shape[0]])
        read_rows_into(up, 0, out[gate.shape[0]:])
        return out
    if layout is Layout.VOCAB:
        (embedding,) = infos
        if embedding.shape[0] != geometry.vocab_size:
            return None
        out = empty((geometry.padded_vocab_size, *embedding.shape[1:]), dtype)
        read_rows_into(embedding, 0, out[:geometry.vocab_size])
        out[geometry.vocab_size:].zero_()  # padded rows stay zero, as _vocab_shard makes them
        return out
    if layout is Layout.QKV:
        q, k, v = infos
        groups = geometry.num_query_groups
        q_rows, kv_rows = geometry.heads_per_group * geometry.head_dim, geometry.head_dim
        rest = q.shape[1:]
        out = empty((groups * (q_rows + 2 * kv_rows), *rest), dtype)
        grouped = out.view(groups, q_rows + 2 * kv_rows, *rest)
        for group in range(groups):
            read_rows_into(q, group * q_rows, grouped[group, :q_rows])
            read_rows_into(k, group * kv_rows, grouped[group, q_rows:q_rows + kv_rows])
            read_rows_into(v, group * kv_rows, grouped[group, q_rows + kv_rows:])
        return out
    return None
