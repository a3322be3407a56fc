"""The HTTP side of EngineClient (client.py, which holds SGLang's endpoints): one connection pool per
event loop, the run's API key, and the one request path.

Policy: every call has a timeout; failures to *connect* are retried with bounded exponential backoff
(the request never reached the server, so a retry cannot run it twice); a read timeout or a dropped
connection mid-request is raised at once; HTTP errors raise with the server's own message. With
`api_key` (the run's, EngineConfig.api_key) every call carries `Authorization: Bearer <key>`, added
only once the server's listener proved to be the run's own (listener_check.py; else the call fails as
a connection error).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import httpx

from lean_rl.backends.sglang.client_errors import EngineConnectionError, EngineHTTPError, EngineTimeoutError, RetryPolicy
from lean_rl.backends.sglang.listener_check import bearer_auth
from lean_rl.backends.sglang.responses import check_success, encode_json_body, error_message

# How long an idle pooled connection may be reused. SGLang's HTTP server closes a connection idle for 5 s
# (uvicorn's timeout_keep_alive: sglang/srt/environ.py SGLANG_TIMEOUT_KEEP_ALIVE), and httpx's default
# expiry is also 5 s: a request sent on a connection the server was closing that instant failed mid-request
# (a weight sync's /end_weight_update, ReadError, in a bench run). A client must give up its idle
# connections before the server does.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass
class EngineHTTP:
    """The HTTP side of EngineClient (client.py): one server's (or the router's) connection pool, its
    key, and the request path with the retry and error policy of the module docstring."""

    base_url: str
    timeout_s: float = 600.0  # per call, unless the call passes its own
    connect_timeout_s: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_connections: int = 4096  # the rollout keeps this many requests in flight at most
    api_key: str | None = field(default=None, repr=False)  # the run's key (EngineConfig.api_key); None/"": none
    # the LoRA adapter every /generate names (EngineConfig.adapter_name, --lora-sync adapter): the
    # engines serve the policy as their base plus this adapter; None: their weights as they are
    adapter: str | None = None
    # httpcore 1.0.9's pool scans every connection it holds when a request starts or ends
    # (connection_pool.py _assign_requests_to_connections, a poll() per idle one): 47% of the rollout's
    # client CPU at 64 requests in flight through one pool. Requests go round-robin to `pool_shards`
    # pools, each holding (and scanning) a share of the connections; the limits are split among them.
    pool_shards: ClassVar[int] = 8
    max_keepalive_connections: ClassVar[int] = 256
    # httpx's async connection pools belong to the event loop that first used them: when the running
    # loop changes (e.g. a second asyncio.run()), start new pools instead of failing on the old ones.
    _pools: tuple[httpx.AsyncClient, ...] = field(default=(), init=False, repr=False)
    _http_loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _turn: int = field(default=0, init=False, repr=False)

    def __post_init__(self):
        self.base_url = self.base_url.rstrip("/")

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if not self._pools or self._http_loop is not loop:
            # trust_env=False: a proxy from the environment must never sit between us and 127.0.0.1
            # the key only to a listener that proves to be the run's, before every request (listener_check.py)
            self._pools = tuple(httpx.AsyncClient(base_url=self.base_url, limits=limits, trust_env=False,
                                                  auth=bearer_auth(self.api_key), verify=tls_context())
                                for limits in pool_limits(self.max_connections, self.max_keepalive_connections,
                                                          self.pool_shards))
            self._http_loop = loop
        self._turn = (self._turn + 1) % len(self._pools)
        return self._pools[self._turn]

    async def aclose(self) -> None:
        if self._pools and self._http_loop is asyncio.get_running_loop():
            await asyncio.gather(*(pool.aclose() for pool in self._pools))
        self._pools, self._http_loop = (), None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def request(
        self, method: str, endpoint: str, json: Any = None, *, timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request with the retry and error policy of the module docstring; `headers` are
        added to the client's own (the API key)."""
        timeout = _timeout(timeout_s or self.timeout_s, self.connect_timeout_s)
        backoffs = self.retry.backoffs()
        content = None if json is None else encode_json_body(json)  # orjson: 8x httpx's json.dumps
        if content is not None:
            headers = {"Content-Type": "application/json", **(headers or {})}
        while True:
            try:
                # as a task of its own: the ~9 times a request waits on its socket resume httpx's frames
                # only, not also the caller's chain of awaits down to here (the rollout's is 7 deep)
                response = await asyncio.ensure_future(self._client().request(
                    method, endpoint, content=content, timeout=timeout, headers=headers))
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                delay = next(backoffs, None)
                if delay is None:
                    raise EngineConnectionError(
                        self.base_url, endpoint, f"cannot connect after {self.retry.attempts} attempts: {exc!r}"
                    ) from exc
                await asyncio.sleep(delay)
            except httpx.TimeoutException as exc:
                raise EngineTimeoutError(self.base_url, endpoint, f"no answer within {timeout.read} s ({exc!r})") from exc
            except httpx.TransportError as exc:
                raise EngineConnectionError(self.base_url, endpoint, f"connection failed mid-request: {exc!r}") from exc
        if response.status_code >= 400:
            raise EngineHTTPError(self.base_url, endpoint, response.status_code, error_message(response))
        return response

    async def _post_json(self, endpoint: str, body: dict | None = None, *, timeout_s: float | None = None) -> Any:
        response = await self.request("POST", endpoint, body if body is not None else {}, timeout_s=timeout_s)
        payload = response.json() if response.content else None
        if isinstance(payload, dict):
            check_success(payload, lambda message: EngineHTTPError(self.base_url, endpoint, response.status_code, message))
        return payload


@functools.lru_cache(maxsize=64)
def _timeout(read_s: float, connect_s: float) -> httpx.Timeout:
    """One httpx.Timeout per pair of limits, shared (httpx only reads it): making one cost every /generate 2 us."""
    return httpx.Timeout(read_s, connect=connect_s)


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """The TLS settings every pool gets (httpx's defaults, the environment ignored as by trust_env=False),
    made once: httpx makes a new one per client otherwise, 29 ms of CPU loading the CA bundle each."""
    return httpx.create_ssl_context(trust_env=False)


def pool_limits(max_connections: int, max_keepalive: int, shards: int) -> list[httpx.Limits]:
    """The limits of each of `shards` pools that together hold at most `max_connections` connections
    (`max_keepalive` of them idle): the totals split as evenly as they go, every pool at least one."""
    if shards < 1 or max_connections < shards:
        raise ValueError(f"pool_limits: {max_connections} connections cannot be shared by {shards} pools")
    return [httpx.Limits(max_connections=max_connections // shards + (i < max_connections % shards),
                         max_keepalive_connections=max(1, max_keepalive // shards + (i < max_keepalive % shards)),
                         keepalive_expiry=KEEPALIVE_EXPIRY_S)
            for i in range(shards)]
