"""Group a stream of (HF name, tensor) into buckets of at most --update-weight-buffer-size bytes.
Pure torch; no processes, no I/O.

A bucket holds one dtype, so that it can travel as one flat byte buffer that SGLang's
FlattenedTensorBucket (sglang/srt/weight_sync/tensor_bucket.py) takes apart again: its receive side
rejects a tensor whose byte offset is not a multiple of its item size, which mixed dtypes could cause.
A tensor larger than the buffer gets a bucket of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch


@dataclass
class Bucket:
    names: list[str] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)
    nbytes: int = 0

    @property
    def dtype(self) -> torch.dtype | None:
        return self.tensors[0].dtype if self.tensors else None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.names.append(name)
        self.tensors.append(tensor)
        self.nbytes += tensor.numel() * tensor.element_size()

    def dtype_names(self) -> list[str]:
        return [str(t.dtype).removeprefix("torch.") for t in self.tensors]

    def shapes(self) -> list[list[int]]:
        return [list(t.shape) for t in self.tensors]

    def flatten(self) -> torch.Tensor:
        """All tensors' bytes back to back (uint8), in `names` order: FlattenedTensorBucket's layout."""
        return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in self.tensors])


def standalone(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` with a storage of its own size: pickling a view would ship its whole base storage."""
    if tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int,
                 ) -> Iterator[tuple[Bucket, bool]]:
    """(bucket, is_last) in stream order; every bucket is non-empty and holds one dtype. A bucket is
    handed out when the next tensor does not fit, so `is_last` costs no extra memory."""
    if max_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {max_bytes}")
    current = Bucket()
    for name, tensor in named_tensors:
        size = tensor.numel() * tensor.element_size()
        if current.tensors and (current.nbytes + size > max_bytes or tensor.dtype != current.dtype):
            yield current, False
            current = Bucket()
        current.add(name, tensor)
    if current.tensors:
        yield current, True
