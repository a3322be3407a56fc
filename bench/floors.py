"""Physical floors for the bench rows: the simplest code that moves the same bytes through the same
medium as the path under test, so that ours / floor >= 1 always holds (bench/run_all.py refuses a row
whose ratio falls below 1: its floor measured another implementation, not the limit).

SocketFloor: loopback TCP from this process to receiver processes, one connection each, kept for all
rounds. `once(parts)` sends every part (with an 8-byte length) to every receiver at once, one sender
thread per receiver; a receiver reads each part whole (and with decode=True, base64-decodes and
unpickles it, as an engine does with an inline payload), then answers one byte. The time is from the
first byte sent to the last answer.

GlooFloor: the distributed transport's own medium on CPU, measured bare: the same tensors broadcast
from this process over a gloo group built as SGLang's engines build theirs (process_group.join_group)
to receiver processes that allocate fresh tensors for every update, as SGLang's receive does
(sglang/srt/model_executor/model_runner_components/weight_updater.py:286, torch.empty per tensor), and
copy each into a tensor allocated once, as its load_weights copies them into the parameters. No HTTP,
no export, no model: what receiving costs an engine before any of our code or SGLang's runs.

raw_copy: the floor of a checkpoint conversion (bench/convert.py), a raw read of the input weight files
and a write of files of the converter's output names and sizes, one fsync per file; prime_cache puts the
page cache in the same state before each run of either side."""

from __future__ import annotations

import base64
import multiprocessing
import os
import pickle
import socket
import struct
import threading
import time
from pathlib import Path

ACK = b"k"
BLOCK = 2**20  # the conversion floor's read and write size (the converters write about 1 MB at a time)
_LENGTH = struct.Struct("!Q")


def _read_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the floor's sender closed the connection")
        got += n


def _receive(host: str, port: int, parts_per_round: int, rounds: int, decode: bool) -> None:
    with socket.create_connection((host, port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = bytearray(_LENGTH.size)
        buffer = bytearray()
        for _ in range(rounds):
            for _ in range(parts_per_round):
                _read_exactly(conn, memoryview(header))
                (size,) = _LENGTH.unpack(header)
                if len(buffer) < size:
                    buffer = bytearray(size)
                view = memoryview(buffer)[:size]
                _read_exactly(conn, view)
                if decode:
                    pickle.loads(base64.b64decode(view))
            conn.sendall(ACK)


def _gloo_receive(port: int, world: int, rank: int, name: str, specs: list, rounds: int, timeout_s: float) -> None:
    import torch

    from lean_rl.backends.megatron.distributed import connect_rendezvous_store
    from lean_rl.weight_sync.process_group import join_group

    group = join_group(connect_rendezvous_store(port, world, timeout_s), world, rank, name, "gloo", timeout_s)
    parameters = [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]  # allocated and touched once
    for _ in range(rounds):
        received = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]  # fresh, as SGLang's receive
        for work in [group.broadcast([tensor], _from_rank_zero()) for tensor in received]:
            work.wait()
        for parameter, tensor in zip(parameters, received):
            parameter.copy_(tensor)
        group.barrier().wait()  # the answer: every receiver holds every tensor in its "parameters"


def _from_rank_zero():
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    return options


class GlooFloor:
    def __init__(self, tensors: list, receivers: int, rounds: int, timeout_s: float = 600):
        from lean_rl.backends.megatron.distributed import open_rendezvous_store
        from lean_rl.weight_sync.process_group import join_group

        self.tensors = [t.contiguous() for t in tensors]
        world = receivers + 1
        store, port = open_rendezvous_store(world, timeout_s)
        name = f"bench_floor_{port}"  # a group name is taken for the process's lifetime
        specs = [(tuple(t.shape), t.dtype) for t in self.tensors]
        context = multiprocessing.get_context("spawn")
        self.procs = [context.Process(target=_gloo_receive, args=(port, world, rank, name, specs, rounds, timeout_s),
                                      daemon=True) for rank in range(1, world)]
        for proc in self.procs:
            proc.start()
        self.group = join_group(store, world, 0, name, "gloo", timeout_s)
        self._store = store  # the receivers' store clients stay connected to it

    def once(self) -> float:
        """Seconds from the first broadcast until every receiver holds every tensor."""
        started = time.perf_counter()
        for work in [self.group.broadcast([tensor], _from_rank_zero()) for tensor in self.tensors]:
            work.wait()
        self.group.barrier().wait()
        return time.perf_counter() - started

    def close(self) -> None:
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


class SocketFloor:
    def __init__(self, receivers: int, parts_per_round: int, rounds: int, decode: bool = False):
        self.host = "127.0.0.1"
        server = socket.create_server((self.host, 0))
        port = server.getsockname()[1]
        context = multiprocessing.get_context("spawn")
        self.procs = [context.Process(target=_receive, args=(self.host, port, parts_per_round, rounds, decode),
                                      daemon=True) for _ in range(receivers)]
        for proc in self.procs:
            proc.start()
        server.settimeout(120)
        self.conns = []
        try:
            for _ in self.procs:
                conn, _ = server.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.conns.append(conn)
        finally:
            server.close()

    def once(self, parts: list[bytes | memoryview]) -> float:
        """Seconds to deliver `parts` to every receiver (and have each decode them, with decode=True)."""
        errors: list[BaseException] = []

        def send(conn: socket.socket) -> None:
            try:
                for part in parts:
                    conn.sendall(_LENGTH.pack(len(part)))
                    conn.sendall(part)
                if conn.recv(1) != ACK:
                    raise ConnectionError("a floor receiver did not answer")
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(err)

        started = time.perf_counter()
        threads = [threading.Thread(target=send, args=(conn,)) for conn in self.conns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        if errors:
            raise errors[0]
        return seconds

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


def weight_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.suffix in (".safetensors", ".distcp"))


def raw_copy(src: Path, dst: Path, layout: Path) -> None:
    """The physical floor of a conversion: read every weight file of `src` and write the files the converter
    wrote to `layout` (the same names and sizes, so the same number of fsyncs), through one buffer
    (readinto, no copies), then one fsync per file; the bytes written are the bytes read (zeros past the end of
    the input, where the output is the larger)."""
    dst.mkdir(parents=True)
    inputs = iter(weight_files(src))
    reader = None
    buffer = bytearray(BLOCK)

    def fill(view: memoryview) -> None:
        nonlocal reader
        got = 0
        while got < len(view):
            if reader is None:
                path = next(inputs, None)
                if path is None:
                    view[got:] = bytes(len(view) - got)
                    return
                reader = open(path, "rb", buffering=0)
            n = reader.readinto(view[got:])
            if not n:
                reader.close()
                reader = None
            got += n or 0

    written = []
    for target in weight_files(layout):
        left = target.stat().st_size
        with open(dst / target.name, "wb") as writer:
            while left > 0:
                view = memoryview(buffer)[:min(BLOCK, left)]
                fill(view)
                writer.write(view)
                left -= len(view)
        written.append(dst / target.name)
    for path in written:  # as the converters do: every file written, then each synced
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    while True:  # every input byte is read, as the converter reads it
        if reader is None:
            path = next(inputs, None)
            if path is None:
                return
            reader = open(path, "rb", buffering=0)
        while reader.readinto(buffer):
            pass
        reader.close()
        reader = None


def prime_cache(src: Path, cache: str) -> None:
    """The page-cache state every timed run starts from, the same for the conversion and its floor: nothing
    dirty (os.sync), the outputs of earlier runs deleted, and the input weight files either read once
    (warm: in the page cache) or dropped from it (cold: posix_fadvise DONTNEED after the sync, which a
    clean page obeys without privileges). Before this, the floor ran in whatever state the conversion
    before it left, so a row could beat its floor and be refused (issue 42)."""
    os.sync()
    for path in weight_files(src):
        with open(path, "rb", buffering=0) as f:
            if cache == "cold":
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                buffer = bytearray(BLOCK)
                while f.readinto(buffer):
                    pass
