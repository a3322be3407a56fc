"""One block of memory that a conversion builds each of its tensors in, one tensor at a time.

A fresh tensor per chunk makes the kernel find, fault in and zero new pages for every byte converted:
in a fresh process that was most of a base100m conversion's CPU time (hf->megatron 0.75 s of CPU, 0.07 s
of it user time; the same conversion run again in the same process, its freed memory reused: 0.2 s;
bench/convert.py). The floor it is measured against, a read + write loop, reuses one buffer; so does this.

Valid only where each tensor is written out before the next one is asked for: the DCP writer with
torch.save serialisation writes an item before resolving the next (filesystem.py _write_files_from_queue,
torch 2.13), and the safetensors writer writes at once (safetensors_io.StreamingSafetensorsWriter.write)."""

from __future__ import annotations

import math

import torch


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
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.nbytes:
            raise ValueError(f"a {list(shape)} {dtype} tensor needs {nbytes} bytes; the buffer has {self.nbytes}")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._bytes[:nbytes], dtype=dtype, count=numel).view(shape)
