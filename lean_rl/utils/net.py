"""Loopback ports: lean_rl binds 127.0.0.1 unless the user asks otherwise."""

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
_LISTEN_RANGE_START = 20000  # above Ray's worker ports (10002-19999 by default)
_PICKER = random.SystemRandom()  # not the seeded global RNG: parallel runs must not pick alike


def _below_ephemeral_range() -> range | None:
    """Ports the kernel never hands out by itself: below net.ipv4.ip_local_port_range, from which
    it takes the local port of every outgoing connection and of every bind(port 0)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(_LISTEN_RANGE_START, low) if low - _LISTEN_RANGE_START >= 1000 else None


def find_free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago. Racy by nature (callers that hand it to another process must
    still report a clear error when that process cannot bind it), so it is picked where the race is
    rare: below the ephemeral range, where no outgoing connection and no bind(0) can take it in the
    seconds before the server starts (Ray alone makes dozens of those while a run starts up, and a
    server that lost its port to one of them died at start). Falls back to the OS's pick."""
    candidates = _below_ephemeral_range()
    if candidates is not None:
        for _ in range(100):
            port = _PICKER.choice(candidates)
            if is_port_free(port, host):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_port_free(port: int, host: str = LOOPBACK) -> bool:
    """No listener on `port`. Binds with SO_REUSEADDR, as uvicorn, the router and torch's store do,
    so a port in TIME_WAIT after a previous run (or an engine restart) counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def require_free_port(port: int, what: str, host: str = LOOPBACK) -> None:
    """Fail before starting anything when a user-chosen port is taken; `what` names the flag."""
    if not is_port_free(port, host):
        raise ValueError(f"{what}: port {port} on {host} is already in use; pick another or leave it unset")
