"""The HTTP side of Tinker's protocol (tinker 0.38), on FastAPI: REST under /api/v1, the key in
X-API-Key (compared in constant time; /api/v1/healthz needs none), futures long-polled through
/retrieve_future (futures.py), protobuf for forward_backward's request and for ForwardBackwardOutput and
SampleResponse (wire.py), JSON elsewhere. What the calls do is service.py's.

Errors: a refused training or sampling call resolves its future as {"error", "category": "user"}
(the SDK raises RequestFailedError with the message); a call this server does not serve answers HTTP
404 with a "not supported" detail (the SDK raises NotFoundError, no retry)."""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from lean_rl.tinker.futures import Done, FutureTable, Pending, UserError
from lean_rl.tinker.wire import decode_forward_backward

PROTO = "application/x-protobuf"
POLL_S = 30.0  # a poll is held this long while its future runs (the client's read timeout is 45 s)

# what the client must not expect of this server (tinker.types.ClientConfigResponse)
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                 "parallel_fwdbwd_chunks": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}

UNSUPPORTED = {
    "save_weights_external": "external weights", "copy_weights": "copying weights",
    "create_custom_loss": "server-side custom losses", "unload_model": "unloading models",
    "retrieve_futures": "batched future polling", "cancel_future": "cancelling samples",
    "join_sampling_session": "joining sampling sessions", "auth/token": "JWT auth",
}


def key_ok(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def create_app(service, api_key: str, deadline_s: float = 1800.0) -> FastAPI:
    """`service`: a TinkerService (service.py), or None for an app that answers only the calls that need
    no trainer (auth, config, sessions: what unit tests check)."""
    if not api_key.startswith("tml-"):
        raise ValueError("TINKER_API_KEY must start with 'tml-' (the tinker SDK refuses other keys)")
    app = FastAPI(title="lean_rl tinker server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.futures = FutureTable(deadline_s)
    v1 = "/api/v1"

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path != f"{v1}/healthz" and not key_ok(request.headers.get("x-api-key"), api_key):
            return JSONResponse({"detail": "invalid or missing X-API-Key"}, status_code=401)
        return await call_next(request)

    def future(work: Callable[[], Awaitable], key: tuple[str, int] | None = None, **extra) -> dict:
        """A retried POST (same model and seq id) gets the first one's future; its work is not redone."""
        known = app.state.futures.existing(key)
        return {"request_id": known or app.state.futures.submit(work(), key), **extra}

    def trainer_call(fn: Callable, *args) -> Callable[[], Awaitable]:
        return lambda: service.on_trainer(fn, *args)

    @app.get(f"{v1}/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post(f"{v1}/client/config")
    async def client_config():
        return CLIENT_CONFIG

    @app.post(f"{v1}/create_session")
    async def create_session():
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        if service is not None:
            service.beat(session_id)
        return {"type": "create_session", "session_id": session_id}

    @app.post(f"{v1}/session_heartbeat")
    async def heartbeat(request: Request):
        body = await request.json()
        if service is not None:
            service.beat(str(body.get("session_id")))
        return {"type": "session_heartbeat"}

    @app.post(f"{v1}/sessions/{{session_id}}/finish")
    async def finish(session_id: str):
        if service is not None:
            service.drop_session(session_id)
        return {}

    @app.post(f"{v1}/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.post(f"{v1}/get_server_capabilities")
    @app.get(f"{v1}/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": service.base_model}] if service is not None else []}

    @app.post(f"{v1}/retrieve_future")
    async def retrieve(request: Request):
        body = await request.json()
        outcome = await app.state.futures.retrieve(str(body.get("request_id")), POLL_S)
        if isinstance(outcome, Pending):
            return JSONResponse({"type": "try_again", "request_id": body.get("request_id"), "queue_state": "active"},
                                status_code=408)
        if isinstance(outcome, Done):
            if isinstance(outcome.value, bytes):
                return Response(outcome.value, media_type=PROTO)
            return outcome.value
        return outcome.body()

    # -- training ---------------------------------------------------------------------------------
    @app.post(f"{v1}/create_model")
    async def create_model(request: Request):
        body = await request.json()
        model_id = f"{body['session_id']}:train:{body.get('model_seq_id', 0)}"
        work = trainer_call(service.create_model, body["session_id"], model_id, body.get("base_model", ""),
                            body.get("lora_config"))
        return future(work, model_id=model_id)

    @app.post(f"{v1}/get_info")
    async def get_info(request: Request):
        body = await request.json()
        try:
            return service.info(body.get("model_id", ""))
        except UserError as err:
            return JSONResponse({"detail": str(err)}, status_code=404)

    @app.post(f"{v1}/forward_backward")
    async def forward_backward(request: Request):
        raw = await request.body()
        try:
            call = decode_forward_backward(raw)
        except UserError as err:
            return {"request_id": app.state.futures.fail_now(str(err))}
        return future(trainer_call(service.forward_backward, call), (call.model_id, call.seq_id),
                      model_id=call.model_id)

    @app.post(f"{v1}/optim_step")
    async def optim_step(request: Request):
        body = await request.json()
        model_id = body.get("model_id", "")
        return future(trainer_call(service.optim_step, model_id, body.get("adam_params")),
                      (model_id, int(body.get("seq_id") or 0)), model_id=model_id)

    @app.post(f"{v1}/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        body = await request.json()
        model_id = body.get("model_id", "")
        seq = body.get("sampling_session_seq_id")
        key = f"{model_id}:sampler:{seq}:{uuid.uuid4().hex[:6]}" if seq is not None else None
        return future(trainer_call(service.save_for_sampler, model_id, body.get("path"), key),
                      (model_id, int(body.get("seq_id") or 0)), model_id=model_id)

    @app.post(f"{v1}/save_weights")
    async def save_state(request: Request):
        body = await request.json()
        model_id = body.get("model_id", "")
        return future(trainer_call(service.save_state, model_id, str(body.get("path") or ""),
                                   bool(body.get("overwrite"))),
                      (model_id, int(body.get("seq_id") or 0)), model_id=model_id)

    @app.post(f"{v1}/load_weights")
    async def load_state(request: Request):
        """Into a training client (load_state), or into a new one (create_training_client_from_state)."""
        body = await request.json()
        existing = body.get("model_id")
        session_id = None if existing else str(body.get("session_id"))
        model_id = existing or f"{session_id}:train:{body.get('model_seq_id', 0)}"
        work = trainer_call(service.load_state, model_id, str(body.get("path") or ""), bool(body.get("optimizer")),
                            session_id, body.get("base_model"))
        return future(work, (model_id, int(body.get("seq_id") or 0)) if existing else None, model_id=model_id)

    # -- sampling ---------------------------------------------------------------------------------
    @app.post(f"{v1}/create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await request.json()
        key = f"{body.get('session_id')}:sample:{body.get('sampling_session_seq_id')}"
        try:
            sid = service.open_sampler(key, body.get("base_model"), body.get("model_path"))
        except UserError as err:
            return JSONResponse({"detail": str(err)}, status_code=404)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    @app.get(f"{v1}/samplers/{{sampler_id:path}}")
    async def sampler(sampler_id: str):
        try:
            return service.sampler_info(sampler_id)
        except UserError as err:
            return JSONResponse({"detail": str(err)}, status_code=404)

    @app.post(f"{v1}/asample")
    async def asample(request: Request):
        body = await request.json()
        count = max(1, int(body.get("num_samples", 1)))
        request_id = app.state.futures.submit(service.sample(str(body.get("sampling_session_id")), body))
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}:{i}" for i in range(count)]}

    # -- the rest of the SDK's surface ------------------------------------------------------------
    @app.api_route(f"{v1}/{{rest:path}}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_supported(rest: str):
        what = UNSUPPORTED.get(rest, f"/api/v1/{rest}")
        return JSONResponse({"detail": f"not supported by lean_rl's Tinker server: {what} (docs/tinker.md)"},
                            status_code=404)

    return app
