"""The lean_rl side of calculator_agent.py: each sample is one agent run through a CaptureSession, its
tool calls run in lean_rl's sandbox, and the reward is set by the rollout code (the last number of the
answer against the label).

    --custom-generate-function-path calculator_hooks.generate      (AGENT=calculator bash run.sh)
"""

from __future__ import annotations

import asyncio
import re

import openai
from calculator_agent import solve

from lean_rl.rollout.openai_capture import CaptureSession
from lean_rl.rollout.sandbox import SandboxLimits, run_python

AGENT_TIMEOUT_S = 300.0
LIMITS = SandboxLimits(wall_timeout_s=5.0, cpu_seconds=2, memory_mb=256, max_output_bytes=4096)


async def run_tool(code: str) -> str:
    return (await run_python(code, LIMITS)).as_observation()


async def generate(cfg, sample, sampling_params):
    async with CaptureSession(cfg, sample, sampling_params) as session:
        async with openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key) as client:
            answer = await asyncio.wait_for(solve(client, sample.prompt, run_tool), AGENT_TIMEOUT_S)
        numbers = re.findall(r"-?\d+", answer)
        session.set_reward(1.0 if numbers and numbers[-1] == str(sample.label) else 0.0)
    return session.samples()


def write_prompts(path: str, n: int = 256, seed: int = 0) -> None:
    import json
    import random
    from pathlib import Path

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(12, 999), rng.randint(12, 99), rng.randint(1, 999)
        rows.append({"prompt": f"What is {a} * {b} + {c}?", "label": str(a * b + c)})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    import sys

    write_prompts(sys.argv[1])
