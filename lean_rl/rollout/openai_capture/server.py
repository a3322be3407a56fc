"""The capture HTTP server: one aiohttp server per event loop and address, started by the first
CaptureSession that needs it, serving every session of that loop under its own path:

    POST /sessions/<id>/v1/chat/completions     the OpenAI chat-completions API (session.chat_completion)
    POST /sessions/<id>/v1/responses            the OpenAI Responses API (session.response, responses.py)
    POST /sessions/<id>/v1/messages             the Anthropic Messages API (session.message, messages.py)
    GET  /sessions/<id>/v1/models               the one model the engines serve
    POST /sessions/<id>/v1/reward               {"reward": number | {name: number}} (session.set_reward)

It binds where the router binds (the driver's address: loopback on one node, the node's Ray address on
a cluster), on a port the OS picks at bind time (the server is bound in this process at once, so no
other process can take the port in between), never 0.0.0.0.

Streaming (`"stream": true` on responses and messages): the call is generated whole, then sent as the
API's server-sent events (one delta per text or tool-call block); chat completions refuse streaming.

Authentication: `Authorization: Bearer <key>` (or `x-api-key: <key>`, the Anthropic client's) with the session's own key (session.api_key, random per
session), or the run's key (--sglang-api-key) when it has one. An agent gets its session's key, which
opens that session and nothing else: not the engines, not the router, not other sessions.

Status codes: 400 malformed request (OpenAI-style error JSON naming the field), 401 wrong key, 404
unknown session, 409 session already closed, 502 generation failed, 503 the trainer aborted generation
(the rollout restarts the sample).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import weakref
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from aiohttp import web

from lean_rl.rollout.base import close_with_the_run
from lean_rl.rollout.openai_capture.chat import error_body
from lean_rl.rollout.openai_capture.messages import anthropic_error, message_events
from lean_rl.rollout.openai_capture.responses import response_events

if TYPE_CHECKING:
    from lean_rl.config import Config

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 2**20  # whole conversations travel in every request; aiohttp's default is 1 MiB
_CLOSED_IDS_KEPT = 100_000  # closed sessions remembered for their 409 (ids only: a few MB at most)


class ServedSession(Protocol):
    """What the server uses of a session (session.CaptureSession is the one): its routing and
    authentication, and one handler per route, each answering (HTTP status, JSON body)."""
    id: str
    model: str
    reward: float | None

    def accepts_key(self, key: str) -> bool: ...

    def refuse(self, message: str, param: str | None = None, status: int = 400) -> tuple[int, dict]: ...

    async def chat_completion(self, body: Any) -> tuple[int, dict]: ...

    async def response(self, body: Any) -> tuple[int, dict]: ...

    async def message(self, body: Any) -> tuple[int, dict]: ...

    def set_reward(self, value: Any) -> None: ...


class CaptureServer:
    def __init__(self, host: str):
        self.host = host
        self.port: int | None = None
        self.sessions: dict[str, ServedSession] = {}
        self._closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> CaptureServer:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._chat_completions)
        app.router.add_post("/sessions/{sid}/v1/responses", self._responses)
        app.router.add_post("/sessions/{sid}/v1/messages", self._messages)
        app.router.add_get("/sessions/{sid}/v1/models", self._models)
        app.router.add_post("/sessions/{sid}/v1/reward", self._reward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, 0).start()
        self.port = self._runner.addresses[0][1]
        logger.info("OpenAI capture endpoint listening at %s/sessions/<id>/v1", self.url)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------ sessions
    def register(self, session: ServedSession) -> None:
        if session.id in self.sessions or session.id in self._closed:
            raise ValueError(f"capture session id {session.id!r} is already in use")
        self.sessions[session.id] = session

    def unregister(self, session_id: str) -> None:
        if self.sessions.pop(session_id, None) is not None:
            self._closed[session_id] = None
            while len(self._closed) > _CLOSED_IDS_KEPT:
                self._closed.popitem(last=False)

    def _session(self, request: web.Request) -> ServedSession:
        """The addressed, authenticated, open session; the HTTP error otherwise."""
        sid = request.match_info["sid"]
        session = self.sessions.get(sid)
        if session is None:
            if sid in self._closed:
                raise _error(409, f"capture session {sid!r} is closed: its rollout is over")
            raise _error(404, f"no capture session {sid!r}")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
        if not token or not session.accepts_key(token):
            raise _error(401, "missing or wrong API key: send 'Authorization: Bearer <session.api_key>'")
        return session

    # ------------------------------------------------------------ handlers
    async def _chat_completions(self, request: web.Request) -> web.Response:
        session = self._session(request)
        try:
            body = await request.json(loads=json.loads)
        except (ValueError, UnicodeDecodeError) as err:
            status, answer = session.refuse(f"the request body is not valid JSON ({err})")
            return web.json_response(answer, status=status)
        try:
            status, answer = await session.chat_completion(body)
        except Exception as err:  # noqa: BLE001 - a bug here must reach the agent and the samples, not hang
            logger.exception("capture session %s: chat completion failed", session.id)
            status, answer = session.refuse(f"internal error in the capture endpoint: {type(err).__name__}: {err}",
                                            None, 500)
        return web.json_response(answer, status=status)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._agent_api(request, "response")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._agent_api(request, "message")

    async def _agent_api(self, request: web.Request, api: str) -> web.StreamResponse:
        """A Responses ("response") or Messages ("message") call: JSON, or its events when streamed."""
        session = self._session(request)
        serve, shape_error, events = ((session.response, lambda body, status: body, response_events) if api == "response"
                                      else (session.message, anthropic_error, message_events))
        try:
            body = await request.json(loads=json.loads)
        except (ValueError, UnicodeDecodeError) as err:
            status, answer = session.refuse(f"the request body is not valid JSON ({err})")
            return web.json_response(shape_error(answer, status), status=status)
        try:
            status, answer = await serve(body)
        except Exception as err:  # noqa: BLE001 - a bug here must reach the agent and the samples, not hang
            logger.exception("capture session %s: %s failed", session.id, api)
            status, answer = session.refuse(f"internal error in the capture endpoint: {type(err).__name__}: {err}",
                                            None, 500)
            answer = shape_error(answer, status)
        if status != 200 or not body.get("stream"):
            return web.json_response(answer, status=status)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        for kind, data in events(answer):
            await stream.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
        await stream.write_eof()
        return stream

    async def _models(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return web.json_response({"object": "list", "data": [
            {"id": session.model, "object": "model", "created": 0, "owned_by": "lean_rl"}]})

    async def _reward(self, request: web.Request) -> web.Response:
        session = self._session(request)
        try:
            body = await request.json(loads=json.loads)
        except (ValueError, UnicodeDecodeError) as err:
            raise _error(400, f"the request body is not valid JSON ({err})") from None
        if not isinstance(body, dict) or "reward" not in body:
            raise _error(400, 'expected {"reward": number or {name: number}}', "reward")
        try:
            session.set_reward(body["reward"])
        except ValueError as err:
            raise _error(400, str(err), "reward") from None
        return web.json_response({"ok": True, "reward": session.reward})


def _error(status: int, message: str, param: str | None = None) -> web.HTTPException:
    return _ERRORS[status](text=json.dumps(error_body(message, param, status)), content_type="application/json")


_ERRORS = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound, 409: web.HTTPConflict}


# ---------------------------------------------------------------- one server per event loop and address
_SERVERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Task]] = weakref.WeakKeyDictionary()


def capture_host(cfg: Config) -> str:
    """Where the router listens (the driver's address); the engines' host flag before it has a URL."""
    try:
        return urlparse(cfg.engines.router_url).hostname or cfg.engines.host
    except (ValueError, RuntimeError):
        return cfg.engines.host


async def capture_server(cfg: Config) -> CaptureServer:
    """This event loop's capture server for the run's address, started on first use."""
    loop = asyncio.get_running_loop()
    host = capture_host(cfg)
    if host in ("0.0.0.0", "::", ""):
        raise ValueError(f"the capture endpoint binds the router's address, and {host!r} is not one "
                         "(use --sglang-host with this node's address)")
    starts = _SERVERS.setdefault(loop, {})
    if not starts:  # this loop's first server: the run stops this loop's servers when its loop ends
        close_with_the_run(cfg, stop_capture_servers)
    if host not in starts:
        starts[host] = loop.create_task(CaptureServer(host).start())
    try:
        return await asyncio.shield(starts[host])
    except Exception:
        if starts.get(host) is not None and starts[host].done():
            del starts[host]  # a failed start is not cached: the next session tries again
        raise


async def stop_capture_servers() -> None:
    """Stop this event loop's capture servers (tests, or a rollout process that wants its port back)."""
    starts = _SERVERS.pop(asyncio.get_running_loop(), {})
    for task in starts.values():
        if task.done() and not task.cancelled() and task.exception() is None:
            await task.result().stop()
