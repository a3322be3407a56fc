"""One block of memory that a conversion builds each of its tensors in, one tensor at a time.

A fresh tensor per chunk asks the allocator for new memory every time, which the kernel may have to
fault in and zero again; the floor a conversion is measured against, a read + write loop, reuses one
buffer, and so does this. Measured on base100m in fresh processes (docs/performance.md, sixth session):
megatron->hf 22-26k page faults a run -> 6.9k; hf->megatron unchanged at 3.2k (glibc already handed its
freed blocks back to it); the wall time of either within the noise.

Valid only where each tensor is written out before the next one is asked for: the DCP writer with
torch.save serialisation writes an item before resolving the next (filesystem.py _write_files_from_queue,
torch 2.13), and the safetensors writer writes at once (safetensors_io.StreamingSafetensorsWriter.write)."""

from __future__ import annotations

import math
from typing import Callable

import torch

# An allocator of uninitialised tensors, as the converters' readers take one: fresh_tensor, or a
# ReusedBuffer's tensor (one block for every chunk).
Empty = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def fresh_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


class ReusedBuffer:
    """Hands out tensors that all live in one block of `nbytes` bytes: the next one overwrites the last."""

    def __init__(self, nbytes: int):
        self._block = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        self._bytes = self._block.numpy().data  # a memoryview of the block

    @property
    def nbytes(self) -> int:
        return self._block.numel()

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous `shape` tensor of `dtype` at the start of the block. Its storage is
        exactly its bytes (torch.frombuffer), not the block: DCP's writer clones any tensor whose storage is
        larger than the tensor (filesystem.py _SerialCpuLoader.values), which would bring the fresh pages back."""
        numel = math.prod(shape)
        nbytes = numel * dtype.itemsize
        if nbytes > self.nbytes:
            raise ValueError(f"a {list(shape)} {dtype} tensor needs {nbytes} bytes; the buffer has {self.nbytes}")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._bytes[:nbytes], dtype=dtype, count=numel).view(shape)
