"""slime.utils.http_utils: `post` and `get` as slime's functions call them, against the run's router
and engines. What lean_rl adds: the run's API key on requests to its own router and engines (never
to other hosts: a search or reward server does not get it); the policy version of every token each
/generate answer carries, recorded for convert.py; and `meta_info.output_token_logprobs` ids taken
from `output_ids` (SGLang 0.5.23 reports the id of the vocabulary's last token as 0 there)."""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import httpx

from lean_rl.backends.sglang.engine_http import KEEPALIVE_EXPIRY_S
from lean_rl.backends.sglang.listener_check import bearer_auth
from lean_rl.backends.sglang.responses import parse_generate_response
from lean_rl.rollout.base import rollout_stopping
from lean_rl.rollout.generate import token_versions
from lean_rl.slime_compat.router_gateway import gateway_origin
from lean_rl.slime_compat.run_state import GenerateAnswer, bound_config, record_answer

logger = logging.getLogger(__name__)

_clients: dict[int, httpx.AsyncClient] = {}  # one pool per event loop


def _client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None or client.is_closed:
        # trust_env=False: no proxy from the environment between the rollout and its engines
        client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False,
                                   limits=httpx.Limits(max_connections=4096, keepalive_expiry=KEEPALIVE_EXPIRY_S))
        _clients[id(loop)] = client
    return client


def _origin(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def _direct(url: str) -> str:
    """A URL on the router gateway (where slime's args.sglang_router_ip/port point) goes to the router
    itself: slime's own requests need no gateway (the key and the versions are handled here)."""
    cfg = bound_config()
    gateway = gateway_origin(cfg)
    parts = urlsplit(url)
    if gateway is None or not cfg.engines.router_url or (parts.hostname, parts.port) != gateway:
        return url
    return urlsplit(cfg.engines.router_url)._replace(path=parts.path, query=parts.query).geturl()


def _ours(url: str) -> bool:
    """`url` is on the run's router or one of its engines."""
    cfg = bound_config()
    return _origin(url) in {_origin(u) for u in (cfg.engines.router_url, *cfg.engines.engine_urls) if u}


def _run_auth(url: str, headers: dict | None = None) -> httpx.Auth:
    """The run's key, for a URL on its router or one of its engines only, and there only once the
    listener proved to be the run's own, before every try (listener_check.py); none (httpx.Auth(),
    which adds nothing) elsewhere or where the caller's headers carry their own Authorization."""
    if not _ours(url) or any(name.lower() == "authorization" for name in headers or {}):
        return httpx.Auth()
    return bearer_auth(bound_config().engines.api_key) or httpx.Auth()


def _is_generate(url: str) -> bool:
    return urlsplit(url).path.rstrip("/").endswith("/generate")


def _served_by_policy(url: str, payload: dict | None) -> dict | None:
    """A /generate body for the run's own router or engines names the LoRA adapter the engines serve
    the policy with (--lora-sync adapter), unless it names one itself: slime's rollouts know no adapter."""
    adapter = bound_config().engines.adapter_name
    if adapter is None or not _is_generate(url) or not _ours(url) or "lora_path" in (payload or {}):
        return payload
    return {**(payload or {}), "lora_path": adapter}


async def post(url: str, payload: dict | None, max_retries: int = 60, headers: dict | None = None):
    """POST `payload` as JSON; the answer's JSON (text when it is not JSON). Retried, 1 s apart, up to
    `max_retries` tries when the server cannot be reached or answers 5xx (an engine restarting); a
    4xx answer raises at once (slime retries those too, but a refused request does not change)."""
    if _is_generate(url) and rollout_stopping():
        # the rollout has enough groups and aborted the engines: a new request would only be surplus
        raise RuntimeError("the rollout is stopping (its batch is full): no new /generate request")
    url = _direct(url)
    auth = _run_auth(url, headers)
    payload = _served_by_policy(url, payload)
    for attempt in range(1, max_retries + 1):
        try:
            response = await _client().post(url, json=payload or {}, headers=headers, auth=auth)
            response.raise_for_status()
            break
        except (httpx.TransportError, httpx.HTTPStatusError) as err:
            response_of = err.response if isinstance(err, httpx.HTTPStatusError) else None
            status = response_of.status_code if response_of is not None else None
            if (status is not None and status < 500) or attempt >= max_retries:
                detail = f": {response_of.text[:500]}" if response_of is not None else ""
                raise RuntimeError(f"POST {url} failed after {attempt} tries ({err}){detail}") from err
            logger.info("POST %s: %s; retrying (%d/%d)", url, err, attempt, max_retries)
            await asyncio.sleep(1)
    try:
        output = json.loads(response.content)
    except json.JSONDecodeError:
        return response.text
    if _is_generate(url) and isinstance(output, dict):
        _note_generate_answer(output)
    return output


def _note_generate_answer(output: dict) -> None:
    """Record the versions of a /generate answer, and give output_token_logprobs the true ids."""
    try:
        result = parse_generate_response(output, return_logprob=False)
    except ValueError:
        return  # not an answer of SGLang's /generate (the user's own server): nothing to record
    entries = output.get("meta_info", {}).get("output_token_logprobs")
    if isinstance(entries, list) and len(entries) == len(result.output_ids):
        for entry, token_id in zip(entries, result.output_ids):
            if isinstance(entry, list) and len(entry) > 1:
                entry[1] = token_id
    record_answer(GenerateAnswer(list(result.output_ids), token_versions(result), result.aborted))


async def get(url: str):
    url = _direct(url)
    response = await _client().get(url, auth=_run_auth(url))
    response.raise_for_status()
    return json.loads(response.content)


def get_rollout_num_engines(args) -> int:
    return int(getattr(args, "rollout_num_engines", None) or 1)
