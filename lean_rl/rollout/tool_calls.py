"""Tool calls in the Hermes / Qwen2.5 format, both ways: parse them out of generated text, and render a
conversation that holds OpenAI-style `tools`, assistant `tool_calls` and `tool` messages into a prompt.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Pure functions; the tokenizer is any HF tokenizer with a chat template.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str  # "call_<random hex>": unique, so a later request can point back at this very call

    def to_openai(self) -> dict:
        """As in an OpenAI chat.completion message: arguments as a JSON string."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class ParsedToolCalls:
    content: str  # the text outside the well-formed calls, stripped (a malformed call's text stays in it)
    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]  # one per malformed call


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


_DECODER = json.JSONDecoder()


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Every `<tool_call>{json}</tool_call>` in `text`. The JSON is decoded before the closing tag is
    looked for, so a `</tool_call>` or braces inside a JSON string do not cut the call short. A call
    with bad JSON, no string `name`, non-object `arguments` (missing arguments: {}) or no closing tag is
    reported in `errors` and its text kept in `content`, so nothing the model wrote is lost."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) != -1:
        outside.append(text[pos:start])
        body_start = start + len(OPEN_TAG)
        call, error, end = _parse_one(text, body_start, len(calls) + len(errors))
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
            outside.append(text[start:end])
        pos = end
    outside.append(text[pos:])
    return ParsedToolCalls(content="".join(outside).strip(), calls=tuple(calls), errors=tuple(errors))


def _parse_one(text: str, body_start: int, number: int) -> tuple[ToolCall | None, str, int]:
    """(call, "", end) or (None, error, end); `end` is just past the call's closing tag, or the end of
    the text when it is unclosed."""
    where = f"tool call {number} (at character {body_start - len(OPEN_TAG)})"
    json_start = body_start + (len(text[body_start:]) - len(text[body_start:].lstrip()))
    try:
        value, json_end = _DECODER.raw_decode(text, json_start)
    except json.JSONDecodeError as exc:
        close = text.find(CLOSE_TAG, body_start)
        if close == -1:
            return None, f"{where}: no closing {CLOSE_TAG}", len(text)
        return None, f"{where}: bad JSON ({exc.msg} at character {exc.pos})", close + len(CLOSE_TAG)
    after = text[json_end:]
    if not after.lstrip().startswith(CLOSE_TAG):
        close = text.find(CLOSE_TAG, json_end)
        if close == -1:
            return None, f"{where}: no closing {CLOSE_TAG}", len(text)
        return None, f"{where}: text after the JSON object before {CLOSE_TAG}", close + len(CLOSE_TAG)
    end = json_end + (len(after) - len(after.lstrip())) + len(CLOSE_TAG)
    if not isinstance(value, dict):
        return None, f"{where}: expected a JSON object, got {type(value).__name__}", end
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None, f"{where}: missing \"name\" (a non-empty string)", end
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None, f"{where}: \"arguments\" must be a JSON object, got {type(arguments).__name__}", end
    return ToolCall(name=name, arguments=arguments, id=new_call_id()), "", end


def format_tool_call(name: str, arguments: dict) -> str:
    """One call as the model writes it (Qwen2.5's chat template renders the same text)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{body}\n{CLOSE_TAG}"


# ---------------------------------------------------------------- rendering a conversation
def tools_system_prompt(tools: list[dict]) -> str:
    """The tools and the call format, in Qwen2.5's words, for templates that do not render `tools`."""
    check_tools(tools)
    specs = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{specs}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f"{OPEN_TAG}{CLOSE_TAG} XML tags:\n"
            f'{OPEN_TAG}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE_TAG}')


def check_tools(tools: Any) -> None:
    """ValueError naming the entry when `tools` is not a list of OpenAI function specs."""
    if not isinstance(tools, list):
        raise ValueError(f"tools: expected a list of function specs, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ValueError(f'tools[{i}]: expected {{"type": "function", "function": {{"name": ...}}}}')
        if not isinstance(tool["function"].get("name"), str) or not tool["function"]["name"]:
            raise ValueError(f"tools[{i}].function.name: expected a non-empty string")


def chat_template_source(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one, else any with tool support
        template = template.get("default") or template.get("tool_use") or next(iter(template.values()), None)
    if not isinstance(template, str) or not template:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template")
    return template


def template_renders_tools(template: str) -> bool:
    return re.search(r"\btools\b", template) is not None


def template_renders_tool_calls(template: str) -> bool:
    return "tool_calls" in template


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                add_generation_prompt: bool = True) -> str:
    """The prompt text of an OpenAI-style conversation. Templates that use `tools` (Qwen2.5, Qwen3, ...)
    get them and the assistant `tool_calls` (arguments decoded into objects, the HF convention);
    otherwise the tools prompt is merged into the system message and tool calls are written into the
    assistant's content in the <tool_call> format. `tool` messages go to the template as they are
    (Qwen's turns them into <tool_response>; a template that renders any role name shows role tool).
    ValueError naming the field (messages[i].content, tools[j]...) on malformed input."""
    template = chat_template_source(tokenizer)
    native_tools = template_renders_tools(template)
    native_calls = template_renders_tool_calls(template)
    msgs = [_normalize_message(m, i, native_calls) for i, m in enumerate(check_messages(messages))]
    kwargs: dict = {}
    if tools:
        check_tools(tools)
        if native_tools:
            kwargs["tools"] = tools
        elif msgs and msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + tools_system_prompt(tools)}
        else:
            msgs.insert(0, {"role": "system", "content": tools_system_prompt(tools)})
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)


def check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: expected a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}]: expected an object, got {type(message).__name__}")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise ValueError(f"messages[{i}].role: expected a non-empty string")
    return messages


def message_text(content: Any, where: str) -> str:
    """A message's content as text: a string, None (""), or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"{where}[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"{where}: expected a string, null or a list of text parts, got {type(content).__name__}")


def _normalize_message(message: dict, i: int, native_calls: bool) -> dict:
    content = message.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content):
        # an image turn (openai_capture/image_parts.py made its image_url parts {"type": "image"}): the
        # template renders the parts, a VLM's writes its image tokens where each image is
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and (part.get("type") == "image" or (
                    part.get("type") == "text" and isinstance(part.get("text"), str)))):
                raise ValueError(f"messages[{i}].content[{j}]: only text and image parts are supported here")
        return {k: v for k, v in message.items() if k != "tool_calls"}
    out = {**message, "content": message_text(content, f"messages[{i}].content")}
    calls = message.get("tool_calls")
    if calls is None or message["role"] != "assistant":
        out.pop("tool_calls", None)
        return out
    decoded = [_decode_call(call, f"messages[{i}].tool_calls[{j}]") for j, call in enumerate(
        calls if isinstance(calls, list) else _raise(f"messages[{i}].tool_calls: expected a list"))]
    if native_calls:
        out["tool_calls"] = [{"id": call.get("id", ""), "type": "function",
                              "function": {"name": name, "arguments": arguments}}
                             for call, (name, arguments) in zip(calls, decoded)]
    else:
        out.pop("tool_calls")
        written = "\n".join(format_tool_call(name, arguments) for name, arguments in decoded)
        out["content"] = f"{out['content']}\n{written}" if out["content"] else written
    return out


def _decode_call(call: Any, where: str) -> tuple[str, dict]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f'{where}: expected {{"type": "function", '
                         f'"function": {{"name": ..., "arguments": ...}}}}')
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}.function.arguments: not valid JSON ({exc.msg})") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}.function.arguments: expected a JSON object")
    return function["name"], arguments


def _raise(message: str):
    raise ValueError(message)
