"""Streaming safetensors I/O for the converters.

Reading uses positioned reads (os.pread) instead of mmap: a memory-mapped file counts every page it
touched in the process RSS until it is unmapped, so reading a whole checkpoint through safe_open costs
its full size in RSS; a read costs only the tensor it returns. Headers are checked against the file
size up front, so a truncated shard is reported before anything is written.

Writing streams too: the header (names, dtypes, shapes, offsets) is known before any data, so each
tensor goes to disk as soon as it is produced. Format: 8-byte little-endian header length, a JSON
header padded with spaces to 8 bytes, then the raw little-endian tensor bytes
(https://github.com/huggingface/safetensors#format)."""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Sequence

import torch

from lean_rl.backends.megatron.checkpoint_paths import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    path: Path
    begin: int  # absolute byte offset in the file
    nbytes: int


def _read_header(path: Path) -> tuple[dict, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(f"{path}: truncated or corrupt safetensors file (header of {length} bytes, "
                                  f"file of {size} bytes)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: corrupt safetensors header ({error})") from None
    return header, 8 + length


class SafetensorsFile:
    """The tensors of one .safetensors file; `read(name)` returns a fresh tensor."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: file not found")
        header, data_start = _read_header(self.path)
        header.pop("__metadata__", None)
        size = self.path.stat().st_size
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            dtype = DTYPES.get(entry.get("dtype"))
            if dtype is None:
                raise CheckpointError(f"{self.path}: tensor {name} has unknown dtype {entry.get('dtype')!r}")
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            if end - begin != nbytes:
                raise CheckpointError(f"{self.path}: tensor {name} {list(shape)} {entry['dtype']} needs {nbytes} "
                                      f"bytes, its header gives {end - begin}")
            if data_start + end > size:
                raise CheckpointError(f"{self.path}: truncated: tensor {name} ends at byte {data_start + end}, "
                                      f"the file has {size} bytes")
            self.tensors[name] = TensorInfo(name, dtype, shape, self.path, data_start + begin, nbytes)

    def read(self, name: str) -> torch.Tensor:
        return read_tensor(self.tensors[name])


def read_tensor(info: TensorInfo) -> torch.Tensor:
    if info.nbytes == 0:
        return torch.empty(info.shape, dtype=info.dtype)
    # read straight into the tensor's own memory: no zero-filled buffer first (a bytearray is one more pass
    # over every byte, ~10% of a conversion), no copy after
    flat = torch.empty(info.nbytes, dtype=torch.uint8)
    view = flat.numpy().data  # a memoryview of the tensor's bytes
    fd = os.open(info.path, os.O_RDONLY)
    try:
        done = 0
        while done < info.nbytes:
            n = os.preadv(fd, [view[done:]], info.begin + done)
            if n == 0:
                raise CheckpointError(f"{info.path}: truncated while reading {info.name}")
            done += n
    finally:
        os.close(fd)
    return flat.view(info.dtype).reshape(info.shape)


class HFSafetensors:
    """All tensors of an HF checkpoint directory (model.safetensors, or shards named by
    model.safetensors.index.json). Every file is opened and checked on construction."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index}: not a safetensors index ({error})") from None
            files = sorted(set(weight_map.values()))
            missing = [name for name in files if not (self.directory / name).is_file()]
            if missing:
                raise CheckpointError(f"{index} names shard(s) that do not exist: {', '.join(missing)}")
        elif (self.directory / SINGLE_FILE).is_file():
            weight_map, files = None, [SINGLE_FILE]
        else:
            raise CheckpointError(f"{self.directory}: no {SINGLE_FILE} or {INDEX_FILE}")
        self.files = {name: SafetensorsFile(self.directory / name) for name in files}
        self.tensors: dict[str, TensorInfo] = {}
        for file_name, opened in self.files.items():
            for name, info in opened.tensors.items():
                if weight_map is None or weight_map.get(name) == file_name:
                    self.tensors[name] = info
        if weight_map is not None:
            absent = [f"{name} ({weight_map[name]})" for name in weight_map if name not in self.tensors]
            if absent:
                raise CheckpointError(f"{index} maps tensors that their shard does not hold: {', '.join(absent[:5])}"
                                      + (f" and {len(absent) - 5} more" if len(absent) > 5 else ""))

    def read(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise CheckpointError(f"tensor {name!r} is not in the HF checkpoint {self.directory}")
        return read_tensor(self.tensors[name])

    def largest_file_bytes(self) -> int:
        return max(opened.path.stat().st_size for opened in self.files.values())


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


class StreamingSafetensorsWriter:
    """Writes one .safetensors file whose tensors are declared up front and then written in that order."""

    def __init__(self, path: str | Path, tensors: Iterable[PlannedTensor], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self._planned = list(tensors)
        self._next = 0
        header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        for t in self._planned:
            header[t.name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                              "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._file: BinaryIO = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(raw)) + raw)

    def _planned_next(self, name: str) -> PlannedTensor:
        """The tensor planned next, which must be `name`."""
        if self._next >= len(self._planned) or self._planned[self._next].name != name:
            expected = self._planned[self._next].name if self._next < len(self._planned) else "nothing"
            raise RuntimeError(f"{self.path}: wrote {name}, expected {expected}")
        return self._planned[self._next]

    def write(self, name: str, tensor: torch.Tensor) -> None:
        planned = self._planned_next(name)
        if tensor.dtype != planned.dtype or tuple(tensor.shape) != planned.shape:
            raise RuntimeError(f"{self.path}: {name} is {tensor.dtype} {list(tensor.shape)}, "
                               f"planned {planned.dtype} {list(planned.shape)}")
        self._write_data(tensor)
        self._next += 1

    def _write_data(self, tensor: torch.Tensor) -> None:
        data = tensor.detach().contiguous().cpu()
        if data.numel():
            self._file.write(memoryview(data.view(torch.uint8).numpy()))

    def write_blocks(self, name: str, blocks: Sequence[torch.Tensor]) -> None:
        """The next planned tensor given as the blocks whose concatenation along dim 0 it is (views of
        other memory: layouts.qkv_blocks), written one after another, not first copied into one tensor."""
        planned = self._planned_next(name)
        rows = sum(block.shape[0] if block.dim() else 1 for block in blocks)
        wrong = [b for b in blocks if b.dtype != planned.dtype or tuple(b.shape[1:]) != planned.shape[1:]]
        if wrong or not planned.shape or rows != planned.shape[0]:
            shapes = ", ".join(f"{b.dtype} {list(b.shape)}" for b in blocks[:4])
            raise RuntimeError(f"{self.path}: {name} given as blocks {shapes}{' ...' if len(blocks) > 4 else ''}, "
                               f"planned {planned.dtype} {list(planned.shape)}")
        for block in blocks:
            self._write_data(block)
        self._next += 1

    def close(self) -> None:
        if self._next != len(self._planned):
            self._file.close()
            raise RuntimeError(f"{self.path}: {len(self._planned) - self._next} planned tensors were not written")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        self._file.close()


def plan_shards(group_bytes: list[int], max_shard_bytes: int) -> list[list[int]]:
    """Pack groups of tensors (each kept in one file) into shards of at most max_shard_bytes, in
    order; returns the group indices of each shard (a group over the limit gets a shard of its own)."""
    shards: list[list[int]] = []
    size = 0
    for index, nbytes in enumerate(group_bytes):
        if not shards or (shards[-1] and size + nbytes > max_shard_bytes):
            shards.append([])
            size = 0
        shards[-1].append(index)
        size += nbytes
    return shards


def shard_file_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def write_index(directory: Path, shards: list[list[PlannedTensor]]) -> None:
    weight_map = {t.name: shard_file_name(i, len(shards)) for i, shard in enumerate(shards) for t in shard}
    total = sum(t.nbytes for shard in shards for t in shard)
    text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True)
    (directory / INDEX_FILE).write_text(text + "\n")


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000' -> bytes (HF's max_shard_size spelling)."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGTIB")
    unit = stripped[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise ValueError(f"size {text!r}: expected a positive number with an optional unit (e.g. 5GB, 500MB)")
    return int(value * units[unit])
