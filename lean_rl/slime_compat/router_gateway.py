"""The router as slime's code sees it at `args.sglang_router_ip:args.sglang_router_port`: a loopback
endpoint of the rollout's process in front of the run's router, for HTTP clients that lean_rl did not
write (strands_sglang's SGLangClient, rollout_buffer's OpenAI client).

Such a client sends no API key, and lean_rl never sees its answers, so the policy version of the
tokens it brings back would be unknown and every sample refused. The gateway forwards each request
to the router with the run's key (only once the router's listener proved to be the run's own,
listener_check.py) and records what lean_rl needs from the answer:

- POST /generate: the output ids and each one's policy version (SGLang's `meta_info.weight_version`,
  with its spans when the weights changed during the request), handed to every slime call running
  now (run_state.record_relayed_answer); convert.py matches them to a sample's tokens.
- POST /v1/chat/completions, /v1/completions: each choice's text with the answer's version
  (`metadata.weight_version`), kept in a bounded table (relayed_text_versions): a sample built from
  the text later (rollout_buffer re-tokenizes the conversation) takes its versions from there.

Only the generation and read-only paths below are forwarded: the engines' admin endpoints (weight
updates, abort, cache flush) are not reachable through it. It binds loopback (127.0.0.1, or ::1 when
the router is on IPv6), never the node's network address nor 0.0.0.0, on a port the OS picks: a
client must run on the driver's node. Anyone on that node who can reach the port can generate with
the run's engines without the key (docs/security.md says so)."""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import logging
import threading
import unicodedata
from typing import TYPE_CHECKING

import httpx
from aiohttp import web

from lean_rl.backends.sglang.engine_http import KEEPALIVE_EXPIRY_S
from lean_rl.backends.sglang.listener_check import bearer_auth
from lean_rl.backends.sglang.responses import parse_generate_response
from lean_rl.rollout.base import parse_weight_version
from lean_rl.rollout.generate import token_versions
from lean_rl.slime_compat.run_state import GenerateAnswer, record_relayed_answer

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

logger = logging.getLogger(__name__)

FORWARDED = {("POST", "/generate"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
             ("GET", "/health"), ("GET", "/health_generate"), ("GET", "/model_info"), ("GET", "/get_model_info"),
             ("GET", "/v1/models")}
MAX_BODY_BYTES = 64 * 2**20
_TEXTS_KEPT = 200_000  # relayed answer texts remembered for samples built from them later


class _TextVersions:
    """Relayed chat / completion answer texts -> the policy versions that wrote them (bounded, oldest out)."""

    def __init__(self) -> None:
        self._table: collections.OrderedDict[str, set[int]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, text: str, versions: set[int]) -> None:
        key = _normal(text)
        if not key:
            return
        with self._lock:
            self._table.setdefault(key, set()).update(versions)
            self._table.move_to_end(key)
            while len(self._table) > _TEXTS_KEPT:
                self._table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._table)

    def latest(self) -> str | None:
        with self._lock:
            return next(reversed(self._table), None)

    def versions_within(self, text: str) -> set[int] | None:
        """The versions of the longest relayed answer whose text `text` holds; None when it holds none."""
        text = _normal(text)
        with self._lock:
            exact = self._table.get(text)
            if exact is not None:
                return set(exact)
            found = [(len(k), v) for k, v in self._table.items() if k in text]
        return set(max(found, key=lambda kv: kv[0])[1]) if found else None


def _normal(text: str) -> str:
    """Text as a re-tokenized conversation gives it back: NFC (Qwen's and most BPE tokenizers normalize
    so), without surrounding whitespace (a chat template may add or trim it)."""
    return unicodedata.normalize("NFC", text).strip()


relayed_text_versions = _TextVersions()


class RouterGateway:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        assert cfg.engines.router_url
        self.router_url = cfg.engines.router_url.rstrip("/")
        router_host = httpx.URL(self.router_url).host
        self.host = "::1" if _is_ipv6(router_host) else "127.0.0.1"
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._client: httpx.AsyncClient | None = None
        self.forwarded = 0  # requests forwarded to the router

    @property
    def address(self) -> tuple[str, int]:
        """What slime's code reads as args.sglang_router_ip / port (an IPv6 host bracketed, as slime does)."""
        assert self.port is not None
        return (f"[{self.host}]" if ":" in self.host else self.host), self.port

    def start(self, timeout_s: float = 30.0) -> RouterGateway:
        bound = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._bind())
            except BaseException as err:  # noqa: BLE001 (handed to start(), which raises it)
                failure.append(err)
                bound.set()
                return
            bound.set()
            self._loop.run_forever()

        threading.Thread(target=serve, name="slime-router-gateway", daemon=True).start()
        if not bound.wait(timeout_s):
            raise RuntimeError(f"slime router gateway: not listening after {timeout_s:.0f} s")
        if failure:
            raise RuntimeError(f"slime router gateway: cannot listen on {self.host}: {failure[0]}") from failure[0]
        logger.info("slime's args.sglang_router_ip/port: a loopback gateway at %s:%d to the router %s (adds the "
                    "run's key; records the policy versions of the answers it relays)", *self.address, self.router_url)
        return self

    async def _bind(self) -> None:
        # trust_env=False: no proxy from the environment between the gateway and the router
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False,
                                         limits=httpx.Limits(max_connections=4096, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{path:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, 0).start()
        self.port = runner.addresses[0][1]

    async def _forward(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["path"]
        if (request.method, path.rstrip("/") or "/") not in FORWARDED:
            return _error(404, f"{request.method} {path} is not forwarded to the router by lean_rl's gateway "
                               f"(forwarded: {', '.join(sorted(m + ' ' + p for m, p in FORWARDED))})")
        assert self._client is not None
        self.forwarded += 1
        body = await request.read()
        payload = _with_policy_adapter(self.cfg, path, body)
        auth = bearer_auth(self.cfg.engines.api_key) or httpx.Auth()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            answer = await self._client.request(request.method, self.router_url + path, params=request.query,
                                                content=payload, headers=headers, auth=auth)
        except httpx.HTTPError as err:
            return _error(502, f"the router at {self.router_url} did not answer: {err}")
        if answer.status_code == 200 and request.method == "POST":
            _record(path.rstrip("/"), answer.content)
        return web.Response(status=answer.status_code, body=answer.content,
                            content_type=answer.headers.get("content-type", "application/json").split(";")[0])


def _with_policy_adapter(cfg: Config, path: str, body: bytes) -> bytes:
    """A /generate body names the LoRA adapter the engines serve the policy with (--lora-sync adapter),
    as http_utils.post does for slime's own requests."""
    adapter = cfg.engines.adapter_name
    if adapter is None or path.rstrip("/") != "/generate":
        return body
    try:
        payload = json.loads(body or b"{}")
    except json.JSONDecodeError:
        return body  # the router answers the malformed request itself
    if not isinstance(payload, dict) or "lora_path" in payload:
        return body
    return json.dumps({**payload, "lora_path": adapter}).encode()


def _record(path: str, content: bytes) -> None:
    try:
        output = json.loads(content)
    except json.JSONDecodeError:
        return
    if path == "/generate":
        for item in output if isinstance(output, list) else [output]:
            try:
                result = parse_generate_response(item, return_logprob=False)
            except (ValueError, TypeError, AttributeError):
                continue
            record_relayed_answer(GenerateAnswer(list(result.output_ids), token_versions(result), result.aborted,
                                                 relayed=True))
        return
    if not isinstance(output, dict):
        return
    metadata = output.get("metadata") or {}
    versions = {parse_weight_version(metadata.get("weight_version"))}
    for span in metadata.get("weight_versions") or ():
        versions.add(parse_weight_version(span[0] if isinstance(span, list) else span.get("version")))
    for choice in output.get("choices") or ():
        message = choice.get("message") or {}
        text = message.get("content") if message else choice.get("text")
        if isinstance(text, str):
            relayed_text_versions.add(text, versions)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).version == 6
    except ValueError:
        return False


_GATEWAYS: dict[int, tuple[Config, RouterGateway]] = {}
_LOCK = threading.Lock()


def router_gateway(cfg: Config) -> RouterGateway:
    """The run's gateway, started by the first rollout-side slime call that needs it (one per run)."""
    with _LOCK:
        entry = _GATEWAYS.get(id(cfg))
        if entry is None or entry[0] is not cfg:
            entry = (cfg, RouterGateway(cfg).start())
            _GATEWAYS[id(cfg)] = entry
        return entry[1]


def gateway_origin(cfg: Config) -> tuple[str, int] | None:
    """(host, port) of the run's gateway when it is running (http_utils.post sends slime's own
    requests for it to the router directly)."""
    entry = _GATEWAYS.get(id(cfg))
    if entry is None or entry[0] is not cfg or entry[1].port is None:
        return None
    return entry[1].host, entry[1].port


def rollout_args(cfg: Config):
    """slime's `args` as the rollout side hands them over: the router's address is the gateway's."""
    from lean_rl.slime_compat.args import slime_args

    args = slime_args(cfg)
    if cfg.engines.router_url:
        args.sglang_router_ip, args.sglang_router_port = router_gateway(cfg).address
    return args
