"""The agent: plain `openai` client code that knows nothing of lean_rl. It answers the toy task's
question ("answer in digits: the cat sat", lean_rl/testing/toy_task.py) in two turns: a draft, then
a final answer after a follow-up question.

    answer = await solve(openai.AsyncOpenAI(base_url=..., api_key=...), "answer in digits: the cat sat")
"""

from __future__ import annotations

import openai

SYSTEM = "You answer in the kind of characters the question asks for."


async def solve(client: openai.AsyncOpenAI, question: str, model: str = "policy", max_tokens: int = 8) -> str:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    draft = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
    messages += [{"role": "assistant", "content": draft.choices[0].message.content},
                 {"role": "user", "content": "final answer?"}]
    final = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
    return final.choices[0].message.content or ""
