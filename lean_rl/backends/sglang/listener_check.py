"""The run's key goes only to a listener that proves to be ours, checked before every request.

After an engine or the router dies, whatever binds its port next would receive the key of every client
that retries. Before a request that carries the key, the listener at its address must prove to be a
process started with the run's key: on this node by the /proc check (listener_proc.py), at the address
of another node of the run's Ray cluster by the same check made there by the run's ListenerAgent
(listener_agent.py). An address that is neither is not sent the key. A listener that fails the check
fails the request as a connection error (ForeignListenerError), so the client's retry deadline applies
as for a dead server. Health and liveness polls carry no key at all (health.py).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import AsyncGenerator, Generator

import httpx

from lean_rl.backends.sglang.listener_agent import remote_node_of, require_remote, require_remote_async
from lean_rl.backends.sglang.listener_proc import ForeignListenerError, is_local, require_local_keyed_listener

__all__ = ["ForeignListenerError", "VerifiedBearer", "bearer_auth", "require_keyed_listener"]


@functools.lru_cache(maxsize=256)
def _resolve(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as exc:  # the connection would fail the same way
        raise ForeignListenerError(f"cannot resolve {host} ({exc}): the key was not sent") from None


def _where(host: str) -> tuple[str, str | None]:
    """(ip of `host`, the Ray node id to ask when the ip is another Ray node's); ForeignListenerError
    when the ip is neither on this node nor on one of the run's Ray nodes (nobody can check it)."""
    ip = _resolve(host)
    node = remote_node_of(ip)
    if node is None and not is_local(ip):
        raise ForeignListenerError(f"{ip} is an address of neither this node nor a node of the run's Ray cluster: "
                                   f"what listens there cannot be verified, the key was not sent")
    return ip, node


def require_keyed_listener(host: str, port: int, key: str) -> None:
    """Return when what listens on (host, port) was started with `key`, checked on its node (see the
    module docstring); ForeignListenerError otherwise, naming what was found."""
    ip, node = _where(host)
    if node is not None:
        require_remote(node, ip, port, key)
    else:
        require_local_keyed_listener(ip, port, key)


async def require_keyed_listener_async(host: str, port: int, key: str) -> None:
    """require_keyed_listener for an event loop (an agent's answer is awaited, not waited for)."""
    ip, node = _where(host)
    if node is not None:
        await require_remote_async(node, ip, port, key)
    else:
        require_local_keyed_listener(ip, port, key)


class VerifiedBearer(httpx.Auth):
    """`Authorization: Bearer <key>` on a request only once its listener proved to be ours."""

    def __init__(self, key: str):
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        try:
            require_keyed_listener(request.url.host, port, self._key)
        except ForeignListenerError as exc:
            raise ForeignListenerError(str(exc), request=request) from None
        request.headers["Authorization"] = f"Bearer {self._key}"
        yield request

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        try:
            await require_keyed_listener_async(request.url.host, port, self._key)
        except ForeignListenerError as exc:
            raise ForeignListenerError(str(exc), request=request) from None
        request.headers["Authorization"] = f"Bearer {self._key}"
        yield request


def bearer_auth(key: str | None) -> VerifiedBearer | None:
    """The auth for an httpx client of the run's servers; None without a key (authentication off)."""
    return VerifiedBearer(key) if key else None
