"""Physical floors for the bench rows: the simplest code that moves the same bytes through the same
medium as the path under test, so that ours / floor >= 1 always holds (bench/run_all.py refuses a row
whose ratio falls below 1: its floor measured another implementation, not the limit).

SocketFloor: loopback TCP from this process to receiver processes, one connection each, kept for all
rounds. `once(parts)` sends every part (with an 8-byte length) to every receiver at once, one sender
thread per receiver; a receiver reads each part whole (and with decode=True, base64-decodes and
unpickles it, as an engine does with an inline payload), then answers one byte. The time is from the
first byte sent to the last answer."""

from __future__ import annotations

import base64
import multiprocessing
import pickle
import socket
import struct
import threading
import time

ACK = b"k"
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
