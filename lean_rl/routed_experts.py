"""Rollout routing replay (R3, arXiv 2510.11370): the experts the engine routed each token to, in the
form a Sample carries them (pure; no backend).

SGLang (server flag --enable-return-routed-experts, request field return_routed_experts) answers with
meta_info.routed_experts: base64 of int32 [len(input + output) - 1, num_layers, topk], one row per token
in sequence order. The last token has no row: it was sampled, never fed through the model. A sample
keeps that string as it came (JSON-friendly: the buffer is checkpointed and samples are dumped to
jsonl), so its rows always cover tokens[:-1]; each row is `width` = num_layers x topk values, a number
only the trainer checks (it knows the layers and top-k).

NO_ROUTE rows are tokens the engine never saw as input, e.g. an observation appended after the last
model call of a multi-turn trajectory (loss-masked; they only shape later positions): the trainer
routes those tokens itself.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

NO_ROUTE = -1
ROUTE_DTYPE = np.int32
_BYTES = np.dtype(ROUTE_DTYPE).itemsize


def encode(routes: np.ndarray) -> str:
    """base64 of the int32 values of `routes` (any shape, row-major), as SGLang sends them."""
    return base64.b64encode(np.ascontiguousarray(routes, dtype=ROUTE_DTYPE).tobytes()).decode("ascii")


def num_values(encoded: str) -> int:
    """How many int32 values `encoded` holds, without decoding it."""
    padding = len(encoded) - len(encoded.rstrip("="))
    size = len(encoded) // 4 * 3 - padding
    if len(encoded) % 4 or size % _BYTES:
        raise ValueError(f"routed_experts: {len(encoded)} base64 characters are not a whole number of int32 values")
    return size // _BYTES


def width(encoded: str, rows: int) -> int:
    """Values per token of `encoded` routes covering `rows` tokens; ValueError when they do not divide."""
    values = num_values(encoded)
    if rows < 1 or values == 0 or values % rows:
        raise ValueError(f"routed_experts: {values} values do not make {rows} rows (one per token but the last)")
    return values // rows


def decode(encoded: str, rows: int) -> np.ndarray:
    """[rows, width] int32 routes from their base64."""
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error as err:
        raise ValueError(f"routed_experts: not base64 ({err})") from None
    return np.frombuffer(raw, dtype=ROUTE_DTYPE).reshape(rows, width(encoded, rows))


def extend(encoded: str, rows: int, new_rows: int) -> str:
    """`encoded` (covering `rows` tokens) followed by `new_rows` NO_ROUTE rows."""
    if new_rows == 0:
        return encoded
    known = decode(encoded, rows)
    return encode(np.concatenate([known, np.full((new_rows, known.shape[1]), NO_ROUTE, dtype=ROUTE_DTYPE)]))
