"""Free a trainer's device memory while the engines generate (colocated mode), and bring it back.

Works on storages, not tensors: every parameter, gradient buffer and optimizer-state tensor is a view
of some storage (Megatron DDP packs grads, and with the distributed optimizer params, into flat
buffers; the optimizer's main params may be views of the model's), so each distinct storage is copied
to host memory once and resized to 0 bytes; on the way back it is resized and refilled, and every
view sees its data again without re-wiring anything. Gradient buffers are not copied: they are zeroed
at the start of every step. The caller decides whether this applies (GPU only: on CPU there is no
device memory to free, and RankTrainer skips it by an explicit device check)."""

from __future__ import annotations

from typing import Iterable

import torch


class HostBuffers:
    """Host buffers (pinned for GPU storages) kept across offloads, by size: the storages of a trainer
    keep their sizes from step to step, so after the first offload every one finds its buffer here,
    and no step pays cudaHostAlloc / free for gigabytes of pinned memory again (review P2)."""

    def __init__(self):
        self._free: dict[tuple[int, bool], list[torch.UntypedStorage]] = {}
        self.allocated = 0  # buffers made (not reused), for tests and logs

    def take(self, nbytes: int, pinned: bool) -> torch.UntypedStorage:
        free = self._free.get((nbytes, pinned))
        if free:
            return free.pop()
        self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()

    def give_back(self, buffer: torch.UntypedStorage) -> None:
        self._free.setdefault((buffer.nbytes(), buffer.is_pinned()), []).append(buffer)


class StorageOffloader:
    def __init__(self, keep: Iterable[torch.Tensor], discard: Iterable[torch.Tensor] = (),
                 host_buffers: HostBuffers | None = None):
        """`keep`: tensors whose data must survive; `discard`: tensors whose data need not (grads);
        `host_buffers`: a pool that outlives this offloader (the trainer rebuilds it every step)."""
        self._buffers = host_buffers if host_buffers is not None else HostBuffers()
        self._storages: dict[int, tuple[torch.UntypedStorage, bool]] = {}
        for tensors, keep_data in ((discard, False), (keep, True)):  # keep wins when shared
            for tensor in tensors:
                storage = tensor.untyped_storage()
                if storage.nbytes() == 0:
                    continue
                self._storages[storage.data_ptr()] = (storage, keep_data)
        self._host: dict[int, torch.UntypedStorage | None] = {}
        self._sizes: dict[int, int] = {}

    @property
    def offloaded(self) -> bool:
        return bool(self._host)

    def offload(self) -> int:
        """Move data to host memory and release the device storages; returns the bytes released."""
        if self.offloaded:
            raise RuntimeError("already offloaded")
        released = 0
        for key, (storage, keep_data) in self._storages.items():
            self._sizes[key] = storage.nbytes()
            host = None
            if keep_data:  # a host buffer of its own (storage.cpu() would alias a CPU storage)
                host = self._buffers.take(storage.nbytes(), pinned=storage.device.type == "cuda")
                host.copy_(storage)
            self._host[key] = host
            released += storage.nbytes()
            storage.resize_(0)
        return released

    def onload(self) -> None:
        if not self.offloaded:
            raise RuntimeError("not offloaded")
        for key, (storage, _) in self._storages.items():
            storage.resize_(self._sizes[key])
            host = self._host[key]
            if host is None:
                storage.fill_(0)
            else:
                storage.copy_(host)
                self._buffers.give_back(host)
        self._host.clear()
