"""The /proc half of listener_check.py: whether what listens on an address of THIS node was started
with the run's key (listener_check.py asks it for this node, listener_agent.py on another node).

After an engine or the router dies, its port is free: whatever binds it next would receive the
`Authorization: Bearer <key>` of every client that retries. SGLang and sglang-router (which lean_rl
does not patch) have no way to prove they know the key without being sent it, so the proof comes
from the kernel: before a request that carries the key, the client finds the socket listening on the
request's address (/proc/net/tcp{,6}) and a process that holds it (/proc/PID/fd), and requires that
process to have been started with the run's key in its environment ($LEAN_RL_SGLANG_API_KEY, how
EngineConfig.server_env / router_env hand it to a server and the router; /proc/PID/environ is readable
by the process's own user and root only). One such holder suffices: a listening socket is shared only
by the processes its creator forked or handed it to. A listener without such a holder, or whose
holders this user cannot see (another user's), is not sent the key: the request fails as a connection
error (ForeignListenerError), so the client's retry deadline applies as for a dead server. psutil
exposes neither a socket's inode nor its holders, hence the few lines of /proc reading here; the scan
goes from the newest pid down (a server is younger than most processes) and stops at the first holder
with the key (measured: ~64 ms for a full scan of 150 processes / 2,800 descriptors).

A listener once verified is remembered as (pid, fd, socket inode): while that descriptor of that
process still holds that socket nobody else can bind the port, and the next request checks it with one
readlink; a restarted server has a new socket and is verified in full again.

Scope: listeners on this node (loopback, or one of this node's addresses); on another node of the
run's Ray cluster the same function runs in that node's ListenerAgent (listener_agent.py).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import sys
from dataclasses import dataclass

import httpx

from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV
from lean_rl.utils.net import interface_of

_TCP_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN
_LITTLE_ENDIAN = sys.byteorder == "little"


class ForeignListenerError(httpx.ConnectError):
    """What listens at a URL of the run is not a process of the run: the key was not sent."""


@dataclass(frozen=True)
class _Verified:
    pid: int
    fd: str  # /proc/PID/fd/N
    link: str  # socket:[inode]


_verified: dict[tuple[str, int, str], _Verified] = {}  # (ip, port, key): verified for that key


@functools.lru_cache(maxsize=256)  # asked before every request; a node's addresses do not change in a run
def is_local(ip: str) -> bool:
    """`ip` is an address of this node (loopback included): its listeners can be inspected here."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified or interface_of(str(address)) is not None


def require_local_keyed_listener(ip: str, port: int, key: str) -> None:
    """require_keyed_listener for an address of this node: the /proc check."""
    known = _verified.get((ip, port, key))
    if known is not None:
        try:
            if os.readlink(known.fd) == known.link:
                return
        except OSError:
            pass
        _verified.pop((ip, port, key), None)
    inode = _listening_inode(ip, port)
    if inode is None:
        raise ForeignListenerError(f"nothing listens on {ip}:{port} (the server is gone): the key was not sent")
    link = f"socket:[{inode}]"
    holders = _holders(link, key)
    ours = [(pid, fd) for pid, fd, started_with_key in holders if started_with_key]
    if not ours:
        who = f"pid {holders[0][0]} ({_name(holders[0][0])})" if holders else "a process this user cannot see"
        raise ForeignListenerError(f"{ip}:{port} is held by {who}, not by a server of this run: the run's key "
                                   f"was not sent")
    pid, fd = ours[0]
    _verified[(ip, port, key)] = _Verified(pid, fd, link)


def _listening_inode(ip: str, port: int) -> int | None:
    """The inode of the socket listening on ip:port (or on the wildcard address), from /proc/net/tcp{,6}."""
    address = ipaddress.ip_address(ip)
    wanted = {address, ipaddress.ip_address("0.0.0.0") if address.version == 4 else ipaddress.ip_address("::")}
    if address.version == 4:  # a dual-stack wildcard listener shows in tcp6 only
        wanted |= {ipaddress.ip_address("::"), ipaddress.ip_address(f"::ffff:{ip}")}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            local_hex, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) == port and _proc_address(local_hex) in wanted:
                return int(fields[9])
    return None


def _proc_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in the host's byte order."""
    words = bytes.fromhex(hex_address)
    raw = b"".join(words[i:i + 4][::-1] if _LITTLE_ENDIAN else words[i:i + 4] for i in range(0, len(words), 4))
    return ipaddress.ip_address(raw)


def _holders(link: str, key: str) -> list[tuple[int, str, bool]]:
    """(pid, /proc/PID/fd/N, started with `key`) of the processes this user can inspect that hold the
    socket `link`, newest pid first, up to the first one started with `key`."""
    found = []
    pids = sorted((int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()), reverse=True)
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                if os.readlink(fd.path) == link:
                    found.append((pid, fd.path, _started_with(pid, key)))
                    break
        except OSError:  # gone, or another user's
            continue
        if found and found[-1][2]:
            break
    return found


def _started_with(pid: int, key: str) -> bool:
    """The process's environment at exec held $LEAN_RL_SGLANG_API_KEY=key (a forked child's too)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return False
    prefix = f"{CHILD_API_KEY_ENV}=".encode()
    values = [entry[len(prefix):] for entry in entries if entry.startswith(prefix)]
    return any(hmac.compare_digest(value, key.encode()) for value in values)


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80] or "?"
    except OSError:
        return "gone"
