"""Loopback ports: lean_rl binds 127.0.0.1 unless the user asks otherwise."""

import socket

LOOPBACK = "127.0.0.1"


def find_free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago (the OS picks it). Racy by nature: callers that hand it to
    another process must still report a clear error when that process cannot bind it."""
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
