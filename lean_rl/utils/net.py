"""Addresses and ports. One node (a local Ray that the run started): every service binds loopback.
A cluster (--ray-address): each service binds the address of the node it runs on, as Ray knows it
(`ray start --node-ip-address`), and others reach it there; never 0.0.0.0."""

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


def service_host(on_cluster: bool) -> str:
    """The address a service started here binds and is reached at: loopback on one node, this node's
    Ray address on a cluster (call it inside the Ray actor that owns the service)."""
    if not on_cluster:
        return LOOPBACK
    import ray

    return ray.util.get_node_ip_address()


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


def interface_of(ip: str) -> str | None:
    """The network interface that holds `ip` ("lo" for any 127.x address), or None when no interface
    of this machine does (then gloo / NCCL fall back to their own choice, the hostname's address)."""
    if ip.startswith("127."):
        return "lo"
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addresses):
            return name
    return None


SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_interface_env(ip: str, environ) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for a process reached at `ip`: the interface holding it,
    unless `environ` already names one (the user's choice wins); {} when no interface holds `ip`."""
    name = interface_of(ip)
    return {var: environ.get(var, name) for var in SOCKET_IFNAME_VARS} if name is not None else {}


def set_socket_interface_env(ip: str) -> dict[str, str]:
    """gloo and NCCL pick their network interface from GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (else
    the hostname's address, which may be one other nodes cannot reach): point them at the interface
    holding `ip`, the address this process is reached at. Set in the process that then creates the
    process groups, before it does; a value the user set wins. Returns the values in effect."""
    import os

    name = interface_of(ip)
    if name is not None:
        for var in SOCKET_IFNAME_VARS:
            os.environ.setdefault(var, name)
    return {var: os.environ[var] for var in SOCKET_IFNAME_VARS if var in os.environ}
