"""The OpenAI chat-completions wire format (pure functions): a request body checked into a ChatRequest,
a generation turned into a `chat.completion` body, and OpenAI-style error bodies."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from lean_rl.rollout.tool_calls import check_messages, check_tools, parse_tool_calls


class RequestError(ValueError):
    """A request the endpoint refuses: HTTP `status`, `param` the offending field (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    tools: list[dict] | None
    parse_tools: bool  # tool_choice "auto" (the default with tools): tool calls are parsed out
    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    stop: tuple[str, ...]


def parse_chat_request(body: Any) -> ChatRequest:
    """RequestError naming the field for anything this endpoint cannot honor; unknown fields are ignored."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError("streaming is not supported: send stream=false (the default)", "stream")
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(f"n={n!r}: only n=1 is supported (send several requests for several samples; "
                           "each becomes its own trajectory)", "n")
    if "messages" not in body:
        raise RequestError("missing required field 'messages'", "messages")
    try:
        check_messages(body["messages"])
    except ValueError as err:
        raise RequestError(str(err), _param_of(str(err))) from None
    tools = body.get("tools")
    if tools is not None:
        try:
            check_tools(tools)
        except ValueError as err:
            raise RequestError(str(err), _param_of(str(err))) from None
    tools = tools or None
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice={tool_choice!r} is not supported: use 'auto' or 'none'", "tool_choice")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise RequestError(f"{max_tokens_field} must be a positive integer, got {max_tokens!r}", max_tokens_field)
    return ChatRequest(
        messages=body["messages"], tools=tools, parse_tools=tools is not None and tool_choice != "none",
        temperature=_number(body, "temperature", low=0.0, high=2.0),
        top_p=_number(body, "top_p", low=0.0, high=1.0, low_open=True),
        max_tokens=max_tokens, stop=_stop(body.get("stop")))


def _param_of(message: str) -> str:
    """`messages[2].content: ...` -> `messages[2].content` (the field a checker's message starts with)."""
    return message.split(":", 1)[0].strip()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value > high or value < low or (low_open and value == low):
        bound = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise RequestError(f"{name} must be a number in {bound}, got {value!r}", name)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise RequestError(f"stop must be a non-empty string or a list of them, got {value!r}", "stop")
    return tuple(value)


# ---------------------------------------------------------------- the answer
@dataclass(frozen=True)
class Completion:
    """What one generation answers: the OpenAI message, its finish reason, and the malformed tool calls."""

    message: dict
    finish_reason: str  # stop | length | tool_calls
    tool_call_errors: tuple[str, ...]
    stop_matched: str | None = None  # the stop string the engine stopped at (cut off the content)


def completion_from_output(text: str, finish_reason: str, stop_matched: Any, parse_tools: bool) -> Completion:
    """`text`: the decoded output without a final stop token (eos). A matched stop string is cut off the
    content with what follows it (OpenAI leaves stop sequences out; the engine stops at the token that
    completes the string, which may hold more text); with `parse_tools`, <tool_call> blocks become
    tool_calls."""
    matched = None
    if finish_reason == "stop" and isinstance(stop_matched, str) and stop_matched and stop_matched in text:
        text, matched = text[:text.rfind(stop_matched)], stop_matched
    finish = "length" if finish_reason == "length" else "stop"
    if parse_tools:
        parsed = parse_tool_calls(text)
        if parsed.calls:
            message = {"role": "assistant", "content": parsed.content or None,
                       "tool_calls": [call.to_openai() for call in parsed.calls]}
            return Completion(message, "tool_calls" if finish == "stop" else finish, parsed.errors, matched)
        return Completion({"role": "assistant", "content": text}, finish, parsed.errors, matched)
    return Completion({"role": "assistant", "content": text}, finish, (), matched)


def chat_completion_body(completion_id: str, model: str, completion: Completion, prompt_tokens: int,
                         completion_tokens: int, created: int | None = None) -> dict:
    return {
        "id": completion_id, "object": "chat.completion", "created": int(created or time.time()), "model": model,
        "choices": [{"index": 0, "message": completion.message, "finish_reason": completion.finish_reason,
                     "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def error_body(message: str, param: str | None = None, status: int = 400) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            409: "conflict_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def message_signature(message: dict) -> tuple[str, tuple[str, ...]] | None:
    """What identifies an assistant message this endpoint answered, when an agent sends it back in its
    history: its content and its tool-call ids (random per call, so a match is this very answer)."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return None
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return None
    return content or "", tuple(str(c.get("id")) for c in calls)


def as_sampled(message: Any, history_text: dict[tuple, str]) -> Any:
    """An assistant message this endpoint answered (found by message_signature in `history_text`), as
    the exact text of the ids the engine sampled for it: tool calls are not re-formatted, a cut stop
    string is back. Any other message unchanged."""
    signature = message_signature(message)
    text = history_text.get(signature) if signature is not None else None
    if text is None:
        return message
    return {k: v for k, v in message.items() if k not in ("tool_calls", "function_call")} | {"content": text}
