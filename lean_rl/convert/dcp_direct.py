"""Reading DCP chunks straight into their destination: one pread per stored piece, no second copy.

DCP's FileSystemReader.read_data (torch 2.13, filesystem.py:861) torch.loads every stored chunk into a
new tensor (the file read in ~128 KiB `readinto`s through a Python file view) and then `copy_`s it into
the destination: two passes over every byte, plus the Python reads. On a 306 MB base100m checkpoint that
was ~0.35 s of the conversion's ~1 s of CPU (bench/convert.py, cProfile).

Here each stored chunk (a torch.save zip record inside a .distcp file) is loaded with
map_location="meta": torch.load then reads only the record's pickle and central directory, and gives the
tensor's dtype, shape, strides and storage offset, with the storage's byte offset inside the record
(`_checkpoint_offset`, set by torch.serialization's load_tensor for meta loads). When the stored piece
and the destination region are both contiguous, same dtype, and the record is in this machine's byte
order, the bytes are read with os.preadv into the destination's own memory: the bytes torch.load would
have produced, bit for bit. Anything else (a transform such as compression, a strided piece, another
byte order or dtype) goes through DCP's own read_data, item by item."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import IO, cast

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from lean_rl.backends.megatron.checkpoint_paths import CheckpointError


class _FileSlice(io.RawIOBase):
    """A read-only, seekable view of bytes [start, start + length) of an open file (one DCP record)."""

    def __init__(self, fd: int, start: int, length: int):
        super().__init__()
        self._fd, self._start, self._length, self._pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        got = os.preadv(self._fd, [view[:n]], self._start + self._pos) if n else 0
        self._pos += got
        return got


def _native_byte_order(record: _FileSlice) -> bool:
    reader = torch._C.PyTorchFileReader(cast(IO[bytes], record))
    native = ("byteorder" in reader.get_all_records()
              and bytes(reader.get_record("byteorder")).decode() == sys.byteorder)
    record.seek(0)  # for the torch.load that follows
    return native


def _read_direct(fd: int, path: Path, start: int, length: int, item: ReadItem, dest: torch.Tensor) -> bool:
    """Read one item straight into `dest` (its destination view); False when it needs DCP's path."""
    record = _FileSlice(fd, start, length)
    if not _native_byte_order(record):
        return False
    stored = torch.load(cast(IO[bytes], record), map_location="meta", weights_only=True)
    if not isinstance(stored, torch.Tensor) or stored.dtype != dest.dtype or not stored.is_contiguous():
        return False
    piece = stored
    for dim, (offset, size) in enumerate(zip(item.storage_offsets, item.lengths)):
        piece = piece.narrow(dim, offset, size)
    if tuple(piece.shape) != tuple(dest.shape) or not piece.is_contiguous() or not dest.is_contiguous():
        return False
    itemsize = dest.element_size()
    record_offset = stored.untyped_storage()._checkpoint_offset  # set by torch.load for map_location="meta"
    if record_offset is None:
        return False
    begin = record_offset + int(piece.storage_offset()) * itemsize
    nbytes = dest.numel() * itemsize
    if begin + nbytes > length:
        raise CheckpointError(f"{path}: the record of {item.storage_index.fqn} at {start} is shorter than its tensor")
    if nbytes == 0:
        return True
    view = dest.reshape(-1).view(torch.uint8).numpy().data.cast("B")
    done = 0
    while done < nbytes:
        n = os.preadv(fd, [view[done:]], start + begin + done)
        if n == 0:
            raise CheckpointError(f"{path}: truncated while reading {item.storage_index.fqn}")
        done += n
    return True


def read_items(reader: FileSystemReader, directory: Path, items: list[ReadItem], planner: LoadPlanner) -> None:
    """Every item into planner.resolve_tensor(item), directly where it can be, else through DCP."""
    storage = reader.storage_data  # the metadata's storage_data (set_up_storage_reader)
    fallback: list[ReadItem] = []
    by_file: dict[str, list[ReadItem]] = {}
    for item in items:
        by_file.setdefault(storage[item.storage_index].relative_path, []).append(item)
    for relative_path, file_items in by_file.items():
        path = directory / relative_path
        fd = os.open(path, os.O_RDONLY)
        try:
            for item in file_items:
                info = storage[item.storage_index]
                if info.transform_descriptors or not _read_direct(fd, path, info.offset, info.length, item,
                                                                  planner.resolve_tensor(item).detach()):
                    fallback.append(item)
        finally:
            os.close(fd)
    if fallback:
        reader.read_data(LoadPlan(fallback), planner).wait()
