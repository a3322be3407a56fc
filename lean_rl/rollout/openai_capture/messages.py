"""The Anthropic Messages API on the capture endpoint (pure functions): a /v1/messages body translated
into a chat-completions body (the same chat template and tools rendering, the same session record),
and a served completion turned into a `message` object or its stream of server-sent events.

`system` (text or text blocks) is the system turn; content blocks: text, tool_use (an assistant tool
call: its id is the call id the endpoint gave, so a sent-back answer is rendered from the sampled
text) and tool_result (a tool turn, placed before the user's text of the same message). Tools:
{"name", "description", "input_schema"}. Errors: {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json
from typing import Any

from lean_rl.rollout.openai_capture.chat import Completion, RequestError

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                409: "invalid_request_error", 502: "api_error", 503: "overloaded_error"}


def anthropic_error(openai_error: dict, status: int) -> dict:
    """An OpenAI-shaped error body of the session, as the Messages API shapes it."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"),
                                       "message": openai_error["error"]["message"]}}


def chat_body_of_messages_request(body: Any) -> dict:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for field in ("messages", "max_tokens"):
        if field not in body:
            raise RequestError(f"{field}: Field required", field)
    system = body.get("system")
    messages = [{"role": "system", "content": _text(system, "system")}] if system else []
    if not isinstance(body["messages"], list):
        raise RequestError("messages: Input should be a valid list", "messages")
    for i, message in enumerate(body["messages"]):
        messages += _chat_messages(message, f"messages.{i}")
    chat: dict[str, Any] = {"messages": messages, "max_tokens": body["max_tokens"]}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise RequestError("tools: Input should be a valid list", "tools")
        chat["tools"] = [_chat_tool(tool, f"tools.{i}") for i, tool in enumerate(body["tools"])]
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "none"):
            raise RequestError(f"tool_choice: {choice!r} is not supported (auto or none)", "tool_choice")
        chat["tool_choice"] = kind
    return chat


def _chat_tool(tool: Any, param: str) -> dict:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise RequestError(f"{param}.name: Field required", f"{param}.name")
    function = {"name": tool["name"], "parameters": tool.get("input_schema", {"type": "object"})}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(b, dict) and b.get("type") == "text"
                                                and isinstance(b.get("text"), str) for b in content):
        raise RequestError(f"{param}: expected text or a list of text blocks", param)
    return "".join(b["text"] for b in content)


def _chat_messages(message: Any, param: str) -> list[dict]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise RequestError(f"{param}.role: Input should be 'user' or 'assistant'", f"{param}.role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    if not isinstance(content, list):
        raise RequestError(f"{param}.content: expected text or a list of content blocks", f"{param}.content")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{param}.content.{j}"
        if kind == "text":
            texts.append(_text([block], where))
        elif kind == "tool_use" and message["role"] == "assistant":
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and message["role"] == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _text(block.get("content", ""), f"{where}.content")})
        else:
            raise RequestError(f"{where}.type: {kind!r} is not supported in a {message['role']} message "
                               "(text, tool_use in assistant, tool_result in user)", f"{where}.type")
    if message["role"] == "assistant":
        return [{"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def message_body(message_id: str, model: str, completion: Completion, prompt_tokens: int,
                 completion_tokens: int, stop_sequences: list[str]) -> dict:
    message = completion.message
    content: list[dict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"])})
    stop = {"length": "max_tokens", "tool_calls": "tool_use"}.get(completion.finish_reason, "end_turn")
    matched = completion.stop_matched if completion.stop_matched in stop_sequences else None
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "stop_sequence" if matched and stop == "end_turn" else stop,
            "stop_sequence": matched if stop == "end_turn" else None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}}


def message_events(body: dict) -> list[tuple[str, dict]]:
    """The stream of one finished message: message_start, each content block start / one delta / stop,
    message_delta (stop reason, usage), message_stop."""
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": body["usage"]["input_tokens"], "output_tokens": 0}}
    events: list[tuple[str, dict]] = [("message_start", {"message": start})]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            events += [("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}),
                       ("content_block_delta", {"index": index, "delta": {"type": "text_delta",
                                                                           "text": block["text"]}})]
        else:
            events += [("content_block_start", {"index": index, "content_block": {**block, "input": {}}}),
                       ("content_block_delta", {"index": index, "delta": {
                           "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})]
        events.append(("content_block_stop", {"index": index}))
    events += [("message_delta", {"delta": {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
                                  "usage": {"output_tokens": body["usage"]["output_tokens"]}}),
               ("message_stop", {})]
    return [(kind, {"type": kind, **data}) for kind, data in events]
