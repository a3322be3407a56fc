"""Request bodies and response parsing for SGLang's native API (0.5.23): pure functions, no I/O."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

from lean_rl import routed_experts as routes
from lean_rl.backends.sglang.image_prompt import check_one_pad_per_image

FINISH_REASONS = ("stop", "length", "abort")


def encode_json_body(body: object) -> bytes:
    """A request body as JSON bytes, by orjson: httpx's json.dumps took 8x as long on an inline weight
    payload (4.6 s vs 0.55 s for 100 MB of base64, docs/performance.md). numpy scalars are written as
    numbers, and other subclasses of float / int as json.dumps writes them."""
    return orjson.dumps(body, default=_plain_number, option=orjson.OPT_SERIALIZE_NUMPY)


def _plain_number(value: object) -> float | int:
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@dataclass(frozen=True)
class WeightVersionSpan:
    """Output tokens [start, end) were generated with weights `version`."""

    version: str
    start: int
    end: int


@dataclass(frozen=True)
class GenerateResult:
    output_ids: list[int]
    output_log_probs: list[float] | None  # one per output token when return_logprob was set
    finish_reason: str  # "stop" (eos / stop token), "length" (max_new_tokens), "abort"
    finish_detail: object  # the matched stop token / string, the length, or the abort message
    weight_version: str | None  # the engine's weight version when the request finished
    weight_version_spans: tuple[WeightVersionSpan, ...]  # which version made which output tokens
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    rid: str
    text: str | None
    # with return_routed_experts: base64 int32 [prompt_tokens + completion_tokens - 1, layers, topk], the
    # experts every token but the last went through (lean_rl/routed_experts.py); None when not asked
    # (or an aborted request that sent none)
    routed_experts: str | None = None

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


def build_generate_payload(
    input_ids: list[int], sampling_params: dict | None = None, *, return_logprob: bool = False, rid: str | None = None,
    return_routed_experts: bool = False, adapter: str | None = None, image_data: list[str] | None = None,
    image_token_id: int | None = None,
) -> dict:
    """`adapter`: the LoRA adapter the request is served with (SGLang's lora_path; None: the plain weights).
    `image_data`: the prompt's images, `input_ids` holding ONE `image_token_id` per image (image_prompt.py)."""
    if isinstance(input_ids, (str, bytes)) or not hasattr(input_ids, "__len__") or len(input_ids) == 0:
        raise ValueError("generate: input_ids must be a non-empty list of token ids")
    try:
        ids = [operator.index(t) for t in input_ids]  # ints, numpy ints; not floats, not nested lists
    except TypeError:
        raise ValueError("generate: input_ids must be integer token ids of one prompt "
                         "(batch by calling generate concurrently)") from None
    payload: dict = {"input_ids": ids, "sampling_params": dict(sampling_params or {})}
    if return_logprob:
        # Output tokens only: logprob_start_len -1 (the default) skips prompt log-probs.
        payload["return_logprob"] = True
    if return_routed_experts:  # from the first token (routed_experts_start_len 0): a sample keeps all
        payload["return_routed_experts"] = True
    if rid is not None:
        payload["rid"] = rid
    if adapter is not None:
        payload["lora_path"] = adapter
    if image_data:
        check_one_pad_per_image(ids, len(image_data), image_token_id)
        payload["image_data"] = list(image_data)
    return payload


def _span(raw) -> WeightVersionSpan:
    if isinstance(raw, dict):
        return WeightVersionSpan(str(raw["version"]), int(raw["start"]), int(raw["end"]))
    version, start, end = raw  # msgspec's array_like form
    return WeightVersionSpan(str(version), int(start), int(end))


def parse_generate_response(body: object, *, return_logprob: bool, return_routed_experts: bool = False) -> GenerateResult:
    """Turn a /generate JSON body into a GenerateResult; ValueError when it is not one.

    Token ids come from `output_ids`, never from `meta_info.output_token_logprobs`: in 0.5.23 that list
    reports the id of token vocab_size-1 as 0 (sglang/srt/managers/logprob_result_processor.py:
    `x if x < vocab_size - 1 else 0`); its log-prob values are right.
    """
    if not isinstance(body, dict):
        raise ValueError(f"expected one JSON object, got {type(body).__name__}")
    if "output_ids" not in body and _error_in_body(body):  # an error answered with HTTP 200
        raise ValueError(f"the server answered an error: {_error_in_body(body)}")
    try:
        output_ids, meta = body["output_ids"], body["meta_info"]
    except KeyError as exc:
        raise ValueError(f"missing field {exc} in {str(body)[:300]}") from exc
    try:
        if not isinstance(output_ids, list):
            raise TypeError
        output_ids = list(map(int, output_ids))  # map: no Python frame per token
    except (TypeError, ValueError) as exc:
        raise ValueError(f"output_ids must be a list of token ids, got {str(body['output_ids'])[:300]}") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"meta_info must be an object, got {type(meta).__name__}")

    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        reason = str(finish.get("type"))
        detail = next((finish[k] for k in ("matched", "length", "message") if k in finish), None)
    else:
        raise ValueError(f"request has not finished (finish_reason={finish!r})")
    if reason not in FINISH_REASONS:
        raise ValueError(f"unknown finish_reason type {reason!r}")

    log_probs = None
    if return_logprob:
        entries = meta.get("output_token_logprobs")
        if entries is None:
            raise ValueError("return_logprob was set but meta_info has no output_token_logprobs")
        if not isinstance(entries, list) or len(entries) != len(output_ids):
            got = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise ValueError(f"{got} output_token_logprobs for {len(output_ids)} output_ids")
        try:
            log_probs = list(map(float, map(operator.itemgetter(0), entries)))
        except (TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"output_token_logprobs entries must be [logprob, id, text] ({exc})") from exc

    prompt_tokens = int(meta.get("prompt_tokens", 0))
    routed = meta.get("routed_experts") if return_routed_experts else None
    if return_routed_experts and not routed and reason != "abort":
        raise ValueError("return_routed_experts was set but meta_info has no routed_experts "
                         "(is the server started with --enable-return-routed-experts?)")
    if routed:
        if not isinstance(routed, str):
            raise ValueError(f"meta_info.routed_experts must be base64 text, got {type(routed).__name__}")
        try:
            routes.width(routed, prompt_tokens + len(output_ids) - 1)  # one row per token but the last
        except ValueError:
            if reason != "abort":
                raise
            routed = None  # an interrupted request's may stop short: the call that continues it brings all

    return GenerateResult(
        output_ids=output_ids,
        output_log_probs=log_probs,
        finish_reason=reason,
        finish_detail=detail,
        weight_version=meta.get("weight_version"),
        weight_version_spans=tuple(_span(s) for s in meta.get("weight_versions") or ()),
        prompt_tokens=prompt_tokens,
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        rid=str(meta.get("id", "")),
        text=body.get("text"),
        routed_experts=routed or None,
    )


@dataclass(frozen=True)
class ScoreResult:
    log_probs: list[float]  # log p(ids[j] | ids[:j]) for j = 1 .. len(ids) - 1
    weight_version: str | None  # the engine's weight version when it scored
    # with top_k > 0: at each j = 1 .. len(ids) - 1, the k likeliest token ids of p(. | ids[:j]) and
    # their log-probs, likeliest first (empty lists when not asked for)
    top_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)


def build_score_payload(input_ids: list[int], top_k: int = 0, adapter: str | None = None) -> dict:
    """One forward pass that returns the log-prob of every input token after the first
    (logprob_start_len 0), and with top_k > 0 the k likeliest tokens at each position
    (top_logprobs_num); one greedy output token is the least /generate will do."""
    payload = build_generate_payload(input_ids, {"max_new_tokens": 1, "temperature": 0.0}, adapter=adapter)
    if len(payload["input_ids"]) < 2:
        raise ValueError("score: input_ids needs at least 2 tokens (the first one has no log-prob)")
    payload["return_logprob"] = True
    payload["logprob_start_len"] = 0
    if top_k:
        payload["top_logprobs_num"] = int(top_k)
    return payload


def parse_score_response(body: object, input_ids: list[int], top_k: int = 0) -> ScoreResult:
    """`meta_info.input_token_logprobs` is [[logprob, id, text], ...] with one entry per input token,
    the first one's log-prob null. Its ids are checked against `input_ids`, except that 0.5.23
    reports id vocab_size-1 as 0 (see parse_generate_response). With top_k, `input_top_logprobs`
    holds, per input token, the top_k [logprob, id, text] of the distribution it was drawn from
    (null for the first)."""
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise ValueError(f"expected a JSON object with meta_info, got {str(body)[:300]}")
    meta = body["meta_info"]
    entries = meta.get("input_token_logprobs")
    if not isinstance(entries, list) or len(entries) != len(input_ids):
        got = len(entries) if isinstance(entries, list) else entries
        raise ValueError(f"expected {len(input_ids)} input_token_logprobs, got {got}")
    for position, (entry, token) in enumerate(zip(entries, input_ids)):
        if int(entry[1]) not in (token, 0):
            raise ValueError(f"input_token_logprobs[{position}] is for token {entry[1]}, the input has {token}")
    if any(entry[0] is None for entry in entries[1:]):
        raise ValueError("input_token_logprobs has a null log-prob after the first token")
    top_ids, top_log_probs = _parse_top(meta.get("input_top_logprobs"), len(input_ids), top_k) if top_k else ([], [])
    return ScoreResult(log_probs=[float(entry[0]) for entry in entries[1:]], weight_version=meta.get("weight_version"),
                       top_ids=top_ids, top_log_probs=top_log_probs)


def _parse_top(rows: object, length: int, top_k: int) -> tuple[list[list[int]], list[list[float]]]:
    if not isinstance(rows, list) or len(rows) != length:
        got = len(rows) if isinstance(rows, list) else rows
        raise ValueError(f"expected {length} input_top_logprobs (top_logprobs_num {top_k}), got {got}")
    ids, log_probs = [], []
    for position, row in enumerate(rows[1:], start=1):
        if not isinstance(row, list) or len(row) != top_k or any(entry[0] is None for entry in row):
            raise ValueError(f"input_top_logprobs[{position}]: expected {top_k} [logprob, id, text] entries, "
                             f"got {str(row)[:200]}")
        ids.append([int(entry[1]) for entry in row])
        log_probs.append([float(entry[0]) for entry in row])
    return ids, log_probs


def _error_in_body(body: dict) -> str | None:
    """The message of an error body ({"error": ...}, {"object": "error", "message": ...}, {"detail": ...})."""
    for key in ("error", "detail", "message"):
        value = body.get(key)
        if isinstance(value, dict) and "message" in value:
            value = value["message"]
        if value and (key != "message" or body.get("object") == "error" or "meta_info" not in body):
            return str(value)[:2000]
    return None


def error_message(response: httpx.Response, limit: int = 2000) -> str:
    """The server's own explanation from an error response (SGLang: {"message"}, its LoRA endpoints:
    {"error_message"}, FastAPI: {"detail"})."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:limit] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("message", "error_message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, dict) and "message" in value:
                value = value["message"]
            if value:
                return str(value)[:limit]
    return str(body)[:limit]


def check_success(payload: dict, make_error: Callable[[str], Exception]) -> None:
    """Weight-update endpoints report failure as {"success": false, "message": ...} (the LoRA ones:
    "error_message")."""
    if payload.get("success") is False:
        raise make_error(str(payload.get("message") or payload.get("error_message") or "success: false"))
