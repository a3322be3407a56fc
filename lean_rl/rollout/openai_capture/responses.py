"""The OpenAI Responses API on the capture endpoint (pure functions): a /v1/responses body translated
into a chat-completions body (so it renders with the same chat template, tools included, and is
recorded by the same session), and a served completion turned into a `response` object or its stream
of server-sent events.

Input items: a string (one user turn), or a list of messages ({"role", "content": text or
input_text / output_text parts}, with or without "type": "message"), "function_call" items (an
assistant tool call; consecutive ones join the assistant message before them, as the model wrote
them) and "function_call_output" items (a tool turn). `instructions` is the system turn; per the API
it is not carried over by `previous_response_id`, which prefixes the history (input and output) of
the response it names. Tools: {"type": "function", "name", "description", "parameters"}.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lean_rl.rollout.openai_capture.chat import Completion, RequestError

_PASSED_ON = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens",
              "tool_choice": "tool_choice"}


def chat_body_of_response_request(body: Any, history: dict[str, list[dict]]) -> tuple[dict, list[dict]]:
    """(the chat-completions body, the history this response continues + its input: what a later
    previous_response_id extends once the answer is appended)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if "input" not in body:
        raise RequestError("missing required parameter: 'input'", "input")
    previous = body.get("previous_response_id")
    if previous is not None and previous not in history:
        raise RequestError(f"Previous response with id '{previous}' not found.", "previous_response_id", 404)
    messages = (list(history[previous]) if previous is not None else []) + _input_messages(body["input"])
    system = body.get("instructions")
    if system is not None and not isinstance(system, str):
        raise RequestError("instructions must be a string", "instructions")
    chat = {"messages": ([{"role": "system", "content": system}] if system else []) + messages}
    for name, chat_name in _PASSED_ON.items():
        if body.get(name) is not None:
            chat[chat_name] = body[name]
    if body.get("tools"):
        chat["tools"] = [_chat_tool(tool, i) for i, tool in enumerate(_list(body["tools"], "tools"))]
    return chat, messages


def _list(value: Any, param: str) -> list:
    if not isinstance(value, list):
        raise RequestError(f"{param} must be an array", param)
    return value


def _chat_tool(tool: Any, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise RequestError(f"tools[{i}]: only function tools are supported", f"tools[{i}].type")
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                             if k in tool}}


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    parts = _list(content, param)
    if not all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str)
               for p in parts):
        raise RequestError(f"{param}: only input_text and output_text parts are supported", param)
    return "".join(p["text"] for p in parts)


def _input_messages(items: Any) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    for i, item in enumerate(_list(items, "input")):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{param} must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"{param}.role must be user, assistant, system or developer, got {role!r}",
                                   f"{param}.role")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not any(
                    m.get("role") == "tool" for m in messages[messages.index(last):]):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else json.dumps(output)})
        else:
            raise RequestError(f"{param}.type {kind!r} is not supported (message, function_call, "
                               "function_call_output)", f"{param}.type")
    return messages


def response_body(response_id: str, model: str, completion: Completion, prompt_tokens: int,
                  completion_tokens: int) -> dict:
    message = completion.message
    output: list[dict] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{response_id}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or ():
        output.append({"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    truncated = completion.finish_reason == "length"
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
            "status": "incomplete" if truncated else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None, "error": None,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def response_events(body: dict) -> list[tuple[str, dict]]:
    """The stream of one finished response: created, each output item added / its text or arguments
    as one delta / done, then completed (or incomplete)."""
    events: list[tuple[str, dict]] = [("response.created", {"response": {**body, "status": "in_progress",
                                                                          "output": []}})]
    for index, item in enumerate(body["output"]):
        events.append(("response.output_item.added", {"output_index": index, "item": item}))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events += [("response.content_part.added", {"item_id": item["id"], "output_index": index,
                                                         "content_index": 0, "part": {**item["content"][0], "text": ""}}),
                       ("response.output_text.delta", {"item_id": item["id"], "output_index": index,
                                                        "content_index": 0, "delta": text}),
                       ("response.output_text.done", {"item_id": item["id"], "output_index": index,
                                                       "content_index": 0, "text": text}),
                       ("response.content_part.done", {"item_id": item["id"], "output_index": index,
                                                        "content_index": 0, "part": item["content"][0]})]
        else:
            events += [("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": index,
                                                                    "delta": item["arguments"]}),
                       ("response.function_call_arguments.done", {"item_id": item["id"], "output_index": index,
                                                                   "arguments": item["arguments"]})]
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    final = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    events.append((final, {"response": body}))
    return [(kind, {"type": kind, "sequence_number": n, **data}) for n, (kind, data) in enumerate(events)]
