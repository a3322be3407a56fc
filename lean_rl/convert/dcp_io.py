"""torch.distributed.checkpoint (DCP) I/O in a single process, streaming, for Megatron's torch_dist
format (a DCP checkpoint plus Megatron's metadata.json and common.pt).

Writing: a SavePlanner whose plan is given as (key, chunk) specs and whose resolve_data produces each
chunk only when the FileSystemWriter asks for it, so nothing is materialised up front. The writer
keeps tensors of the file it is writing alive until that file is closed (filesystem.py
_write_files_from_queue, torch 2.13: `tensor_dict[fqn] = tensor`, the last chunk of each key), so
files are also cut at a byte budget: peak memory stays below one file plus the tensor being built.

Reading: the storage-reader protocol directly (read_metadata once; per request a LoadPlan from
DCP's own resharding helper `create_read_items_for_chunk_list`), so any region of a stored tensor is
read from whatever chunks a Megatron save of any layout wrote."""

from __future__ import annotations

import contextlib
import io
import json
import queue
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from lean_rl.backends.megatron.checkpoint_paths import DCP_METADATA, CheckpointError
from lean_rl.convert.dcp_direct import read_items
from lean_rl.convert.reused_buffer import Empty, fresh_tensor

# Megatron's metadata.json for torch_dist (dist_checkpointing/core.py CheckpointingConfig) and its
# common state file (strategies/common.py COMMON_STATE_FNAME).
MEGATRON_METADATA = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                     "common_backend": "torch", "common_backend_version": 1}
METADATA_JSON = "metadata.json"
COMMON_FILE = "common.pt"


@dataclass(frozen=True)
class ChunkSpec:
    """One stored piece: `key`'s region [offsets, offsets + sizes) of a `global_shape` tensor."""

    key: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = torch.empty((), dtype=self.dtype).element_size()
        for size in self.sizes:
            n *= size
        return n


class _LazyPlanner(SavePlanner):
    """Plans the given chunks and objects; produces each one when the writer resolves it."""

    def __init__(self, chunks: list[ChunkSpec], produce: Callable[[ChunkSpec], torch.Tensor],
                 objects: dict[str, object]):
        self._chunks = {(c.key, c.offsets): c for c in chunks}
        self._order = chunks
        self._produce = produce
        self._objects = objects

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        pass

    def create_local_plan(self) -> SavePlan:
        items = [WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO) for key in self._objects]
        for c in self._order:
            items.append(WriteItem(
                index=MetadataIndex(c.key, torch.Size(c.offsets)), type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)),
                                            properties=TensorProperties(dtype=c.dtype),
                                            size=torch.Size(c.global_shape))))
        return SavePlan(items)

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        return create_default_global_save_plan(all_plans)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem):
        if write_item.type == WriteItemType.BYTE_IO:
            buffer = io.BytesIO()
            torch.save(self._objects[write_item.index.fqn], buffer)  # as Megatron: a list of the objects
            buffer.seek(0)
            return buffer
        spec = self._chunks[(write_item.index.fqn, tuple(write_item.index.offset))]
        tensor = self._produce(spec)
        if tuple(tensor.shape) != spec.sizes or tensor.dtype != spec.dtype:
            raise RuntimeError(f"{spec.key} at {list(spec.offsets)}: produced {tensor.dtype} {list(tensor.shape)}, "
                               f"planned {spec.dtype} {list(spec.sizes)}")
        return tensor


class _BudgetedFileWriter(FileSystemWriter):
    """FileSystemWriter that cuts files at a byte budget, in plan order (the stock writer puts a rank's
    items in thread_count files). Overrides write_data only, reusing the base class's file writing
    (filesystem.py write_data / _write_data, torch 2.13)."""

    def __init__(self, path: Path, max_file_bytes: int):
        super().__init__(path, single_file_per_rank=True, thread_count=1, overwrite=False)
        self.max_file_bytes = max_file_bytes

    def write_data(self, plan: SavePlan, planner: SavePlanner):
        files: list[list[WriteItem]] = [[]]
        size = 0
        for item in plan.items:
            nbytes = 0 if item.tensor_data is None else _chunk_bytes(item.tensor_data)
            if files[-1] and size + nbytes > self.max_file_bytes:
                files.append([])
                size = 0
            files[-1].append(item)
            size += nbytes
        file_queue: queue.Queue = queue.Queue()
        for i, items in enumerate(files):
            name = f"{plan.storage_data.prefix}{i}{DEFAULT_SUFFIX}"
            file_queue.put((self.fs.concat_path(self.path, name), name, items))
        return self._write_data(planner, file_queue)


def _chunk_bytes(data: TensorWriteData) -> int:
    n = torch.empty((), dtype=data.properties.dtype).element_size()
    for size in data.chunk.sizes:
        n *= size
    return n


@contextlib.contextmanager
def _without_crc32() -> Iterator[None]:
    """DCP stores every chunk as a torch.save zip record, and torch.save computes a CRC32 of each record by
    default: one more pass over every byte, ~1/3 of a conversion's time on CPU (bench/convert.py). Neither
    torch.load nor Megatron's loader checks it (torch/utils/serialization/config.py: `compute_crc32`, the
    switch torch provides for exactly this), so the converter writes without it."""
    from torch.utils.serialization import config

    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = before


def save_dist_checkpoint(directory: Path, chunks: list[ChunkSpec], produce: Callable[[ChunkSpec], torch.Tensor],
                         objects: dict[str, object], max_file_bytes: int, common: dict | None = None) -> None:
    """Write a Megatron torch_dist checkpoint into the (existing, empty) `directory`: the chunks,
    each produced on demand, the ShardedObjects `objects` (unique key -> list of values), common.pt,
    and metadata.json last (as Megatron does, so a directory without it is incomplete)."""
    writer = _BudgetedFileWriter(directory, max_file_bytes)
    try:
        with warnings.catch_warnings(), _without_crc32():  # "torch.distributed is disabled ... single process"
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({}, storage_writer=writer, planner=_LazyPlanner(chunks, produce, objects), no_dist=True)
    except CheckpointException as error:  # DCP wraps the failure of its one (local) rank: re-raise it
        failures = list(error.failures.values())
        if failures and isinstance(failures[0][0], Exception):
            raise failures[0][0] from None
        raise
    torch.save(common or {}, directory / COMMON_FILE)
    (directory / METADATA_JSON).write_text(json.dumps(MEGATRON_METADATA))


class _RegionPlanner(LoadPlanner):
    """Copies each read into its slice of one destination tensor."""

    def __init__(self, dest: torch.Tensor):
        self.dest = dest

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        pass

    def create_local_plan(self) -> LoadPlan:
        raise NotImplementedError("plans are built by DistCheckpointReader")

    def create_global_plan(self, global_plan):
        return global_plan

    def finish_plan(self, central_plan):
        return central_plan

    def load_bytes(self, read_item: ReadItem, value) -> None:
        raise RuntimeError(f"unexpected bytes read for {read_item.dest_index.fqn}")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        view = self.dest  # dest_offsets are relative to the requested region
        for dim, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            view = view.narrow(dim, offset, length)
        return view

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass


class DistCheckpointReader:
    """Reads regions of the tensors of a torch_dist checkpoint directory."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        meta_json = self.directory / METADATA_JSON
        if not meta_json.is_file():
            raise CheckpointError(f"{self.directory}: no {METADATA_JSON}; not a complete Megatron dist checkpoint")
        backend = json.loads(meta_json.read_text()).get("sharded_backend")
        if backend != "torch_dist":
            raise CheckpointError(f"{meta_json}: sharded_backend {backend!r}; only torch_dist is supported")
        if not (self.directory / DCP_METADATA).is_file():
            raise CheckpointError(f"{self.directory}: no {DCP_METADATA} (torch.distributed.checkpoint metadata)")
        self._reader = FileSystemReader(self.directory)
        self.metadata = self._reader.read_metadata()
        self._reader.set_up_storage_reader(self.metadata, is_coordinator=True)
        self._check_files()

    def _check_files(self) -> None:
        """Every stored item's file exists and is long enough (a missing or truncated .distcp)."""
        needed: dict[str, int] = {}
        for info in self.metadata.storage_data.values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
        for name, end in sorted(needed.items()):
            path = self.directory / name
            if not path.is_file():
                raise CheckpointError(f"{path}: missing (the checkpoint metadata names it)")
            if path.stat().st_size < end:
                raise CheckpointError(f"{path}: truncated: the checkpoint metadata needs {end} bytes, "
                                      f"the file has {path.stat().st_size}")

    def tensors(self) -> dict[str, TensorStorageMetadata]:
        return {k: v for k, v in self.metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}

    def objects(self) -> list[str]:
        return [k for k, v in self.metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]

    def read(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...],
             empty: Empty = fresh_tensor) -> torch.Tensor:
        """The region [offsets, offsets + sizes) of `key`, in a tensor from `empty` (a new one by default)."""
        stored = self.metadata.state_dict_metadata[key]
        dest = empty(tuple(sizes), stored.properties.dtype)
        wanted = ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))
        items = create_read_items_for_chunk_list(key, stored, [wanted])
        covered = sum(_numel(item.lengths) for item in items)
        if covered != dest.numel():
            raise CheckpointError(f"{self.directory}: the stored chunks of {key} cover {covered} of the "
                                  f"{dest.numel()} elements at {list(offsets)} + {list(sizes)}")
        read_items(self._reader, self.directory, items, _RegionPlanner(dest))  # DCP's read_data, without its copy
        return dest


def _numel(sizes) -> int:
    n = 1
    for size in sizes:
        n *= size
    return n
