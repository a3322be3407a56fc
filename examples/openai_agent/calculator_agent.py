"""The tool-calling task of examples/tool_calling, written as a plain `openai`-client agent: it sends the
question with a `python` tool, runs each tool call it gets back with the `run_tool` it was given, and
answers when the model stops calling. It knows nothing of lean_rl.

    answer = await solve(openai.AsyncOpenAI(base_url=..., api_key=...), "What is 347 * 29 + 18?", run_tool)
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import openai

TOOLS = [{"type": "function", "function": {
    "name": "python",
    "description": "Run Python code and return what it prints, e.g. print(347 * 29).",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]


async def solve(client: openai.AsyncOpenAI, question: str, run_tool: Callable[[str], Awaitable[str]],
                model: str = "policy", max_rounds: int = 4, max_tokens: int = 64) -> str:
    messages: list[dict] = [{"role": "user", "content": question + " Use the python tool, then answer with the number."}]
    for _ in range(max_rounds):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                     max_tokens=max_tokens)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                code = json.loads(call.function.arguments).get("code", "")
                output = await run_tool(code) if call.function.name == "python" else "error: unknown tool"
            except (json.JSONDecodeError, AttributeError):
                output = "error: arguments must be a JSON object with 'code'"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return ""
