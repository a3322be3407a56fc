"""slime.backends.megatron_utils.cp_utils at one context-parallel rank, the only size lean_rl trains with
(`--context-parallel-size` > 1 is refused, docs/slime_flags.md): gathering a sample's response values
from the CP ranks and slicing this rank's share back out are then the identity, as they are in slime
at CP size 1. Served so that slime's trainer-side hooks written for CP (its train_infer_mismatch_helper
example's `compute_mis_weights_with_cp`) run unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _check(values: Any, total_length: int, response_length: int, name: str) -> None:
    if len(values) != response_length:
        raise ValueError(f"{name}: {len(values)} values for response_length {response_length} "
                         f"(total_length {total_length})")


def all_gather_with_cp(tensor: torch.Tensor, total_length: int, response_length: int) -> torch.Tensor:
    """The sample's values over its whole response: at one CP rank, what this rank holds."""
    return tensor


def slice_log_prob_with_cp(log_prob: list[float] | torch.Tensor, total_length: int,
                           response_length: int) -> list[float] | torch.Tensor:
    """This CP rank's share of a sample's response values: at one rank, all of them."""
    _check(log_prob, total_length, response_length, "slice_log_prob_with_cp")
    return log_prob


def slice_with_cp(tokens: torch.Tensor, pad_value: int | float | Callable) -> torch.Tensor:
    """This CP rank's share of a packed sequence: at one rank, the whole sequence, unpadded."""
    return tokens
