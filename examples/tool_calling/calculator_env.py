"""A tool-calling agent: the model may call a Python tool (run in lean_rl's sandbox) before it answers.

    --environment-path calculator_env.CalculatorEnv      (with PYTHONPATH=examples/tool_calling)

A model turn that holds `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>` gets
the code's output back as a `tool` message; a malformed call gets an error message instead (the
episode goes on, the model can fix it); a turn with no call is the final answer: reward 1 when its
last number equals the label, the episode ends. The tool call format is the Hermes / Qwen2.5 one
(lean_rl/rollout/tool_calls.py), described to the model in the system prompt (make_prompts).

    python examples/tool_calling/calculator_env.py --out DIR     # DIR/train.jsonl, DIR/eval.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from lean_rl.rollout.environment import Observation, StepResult
from lean_rl.rollout.sandbox import SandboxLimits, run_python
from lean_rl.rollout.tool_calls import parse_tool_calls

TOOLS = [{"type": "function", "function": {
    "name": "python",
    "description": "Run Python code in a sandbox and return what it prints, e.g. print(347 * 29).",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                   "required": ["code"]}}}]
# Hermes' own tool prompt (tools_system_prompt(TOOLS)) costs ~240 tokens of SmolLM2's per sample, which on 2
# CPU cores is most of a step's training time; this short one says the same for the one tool.
SYSTEM = ('You have a python tool. To run code, write <tool_call>{"name": "python", "arguments": {"code": '
          '"print(...)"}}</tool_call> and stop; its output comes back. Then answer with the number only.')
# Each call gets its own process: 5 s of wall clock, 2 s of CPU, 256 MB, 4 KB of output, no network.
LIMITS = SandboxLimits(wall_timeout_s=5.0, cpu_seconds=2, memory_mb=256, max_output_bytes=4096)
MAX_CALLS_PER_TURN = 2
_NUMBER = re.compile(r"-?\d+")


class CalculatorEnv:
    def __init__(self, cfg, sample):
        self.label = str(sample.label)

    async def reset(self, sample):
        return None  # the prompt (system + question) is the first observation

    async def step(self, action: str) -> StepResult:
        parsed = parse_tool_calls(action)
        if parsed.errors:
            return StepResult(Observation(text="error: " + "; ".join(parsed.errors), role="tool"),
                              None, False, {"malformed_calls": len(parsed.errors)})
        if not parsed.calls:  # no call: this is the answer
            numbers = _NUMBER.findall(parsed.content)
            correct = bool(numbers) and numbers[-1] == self.label
            return StepResult(None, 1.0 if correct else 0.0, True, {"answer": numbers[-1] if numbers else None})
        outputs, statuses = [], []
        for call in parsed.calls[:MAX_CALLS_PER_TURN]:
            code = call.arguments.get("code")
            if call.name != "python" or not isinstance(code, str):
                outputs.append('error: call the tool as {"name": "python", "arguments": {"code": "..."}}')
                statuses.append("bad_call")
                continue
            result = await run_python(code, LIMITS)
            outputs.append(result.as_observation())
            statuses.append(result.status)
        if len(parsed.calls) > MAX_CALLS_PER_TURN:
            outputs.append(f"error: at most {MAX_CALLS_PER_TURN} calls per turn; the rest were not run")
        return StepResult(Observation(text="\n".join(outputs), role="tool"), None, False, {"tools": statuses})


def _question(rng: random.Random) -> tuple[str, str, int]:
    a, b, c = rng.randint(12, 999), rng.randint(12, 99), rng.randint(1, 999)
    return f"What is {a} * {b} + {c}?", f"{a} * {b} + {c}", a * b + c


def make_prompts(path: Path, n: int, seed: int) -> None:
    """Arithmetic a small model gets wrong in its head but right with the tool."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, _, answer = _question(rng)
        rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                     "label": str(answer)})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_traces(path: Path, n: int, seed: int) -> None:
    """Conversations of the whole episode for the supervised warm start (--loss-type sft_loss): the
    call, the tool's answer (not trained on), the final answer. Other questions than the prompts'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, expression, answer = _question(rng)
        call = json.dumps({"name": "python", "arguments": {"code": f"print({expression})"}})
        rows.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
                                  {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                                  {"role": "tool", "content": str(answer)},
                                  {"role": "assistant", "content": str(answer)}], "label": str(answer)})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    make_prompts(args.out / "train.jsonl", 512, seed=0)
    make_prompts(args.out / "eval.jsonl", 32, seed=1)
    make_traces(args.out / "traces.jsonl", 256, seed=2)
    print(f"wrote {args.out}/train.jsonl, eval.jsonl and traces.jsonl")
