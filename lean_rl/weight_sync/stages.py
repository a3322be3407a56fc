"""What a weight sync's two sides and its transports share: the plan every rank is sent, the engines
the driver found, and a stage's exported tensors and report. A leaf: sync.py, rank.py and the
transports import it, and it imports none of them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch


@dataclass(frozen=True)
class EngineInfo:
    url: str
    device: str
    tp_size: int
    model_path: str
    tokenizer_path: str | None
    dtype: str  # what it computes in ("bfloat16", ...: its --dtype, `auto` resolved as SGLang does)


@dataclass(frozen=True)
class RankSyncPlan:
    """What every rank needs to know; sent once, at connect."""

    # a transports.base.Transport subclass: its rank half runs on every rank (a class: it pickles by reference)
    transport: Any
    engine_urls: tuple[str, ...]
    engine_tp_sizes: tuple[int, ...]
    buffer_size_bytes: int
    timeout_s: float
    family: str
    group_prefix: str  # unique per WeightSync: process-group names are global in a process
    backend: str  # gloo (CPU) | nccl (GPU)
    api_key: str | None = field(default=None, repr=False)  # the run's, which the engines require
    # the engines' dtype ("bfloat16", ...): tensors travel in it (SGLang would cast them on load
    # anyway), so a float32 trainer sends a 16-bit engine half the bytes, and the checksums after a
    # failed probe hash exactly the bytes the engine holds. None: the trainer's own dtypes.
    dtype: str | None = None

    def group_name(self, stage: int) -> str:
        return f"{self.group_prefix}_pp{stage}"


@dataclass(frozen=True)
class StageSent:
    stage: int
    bytes: int
    buckets: int
    tensors: int
    export_seconds: float  # gathering HF tensors from the Megatron shards (TP/EP all-gathers, layouts)
    send_seconds: float  # everything else on the lead: flatten / serialize / write, engine calls
    weight_map: dict[str, str] | None = None  # disk: HF name -> file name in the directory
    # An engine call or broadcast failed (an engine died or restarted): the lead went on exporting
    # without sending, so that its TP/EP peers' all-gathers complete and the trainer group lives on.
    error: str | None = None
    # adapter transport: the stage's LoRA tensors (PEFT name -> CPU tensor), which the driver loads on
    # the engines in one call (SGLang loads an adapter whole, so stages cannot send their parts)
    adapter: dict[str, torch.Tensor] | None = None


def in_dtype(named_tensors: Iterable[tuple[str, torch.Tensor]],
             dtype: str | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The exported tensors as they travel: cast to the engines' dtype (None: as they are)."""
    if dtype is None:
        yield from named_tensors
        return
    torch_dtype = getattr(torch, dtype)
    for name, tensor in named_tensors:
        yield name, tensor.to(torch_dtype)


class TimedExport:
    """A stage's exported tensors, as (name, tensor) items, counting the seconds spent producing them
    (the export) apart from the transport's sending, which consumes them; `sent` reports both."""

    def __init__(self, stage: int, items):
        self.stage = stage
        self._items = iter(items)
        self.started = time.perf_counter()
        self.seconds = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        started = time.perf_counter()
        try:
            return next(self._items)
        finally:
            self.seconds += time.perf_counter() - started

    def sent(self, nbytes: int, buckets: int, tensors: int, **extra) -> StageSent:
        return StageSent(self.stage, nbytes, buckets, tensors, self.seconds,
                         time.perf_counter() - self.started - self.seconds, **extra)
