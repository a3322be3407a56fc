"""Generated addition problems for the math example, as JSONL rows {"prompt": ..., "label": ...}.

    python examples/math_real_model/make_prompts.py --out DIR [--train 2000 --eval 64 --max-operand 20]

The prompt is the bare question; run.sh passes --apply-chat-template, so the model sees it inside
its own chat template. `--rm-type math` (math-verify) reads the last number or \\boxed{} of the
response and compares it with the label, so the wording asks for a boxed final answer. With
operands up to 20, SmolLM2-135M-Instruct at temperature 0.7 gets about a third right before training:
enough right answers for GRPO to learn from, enough wrong ones to leave room to learn.

Note: math-verify also accepts an unevaluated expression ("\\boxed{13 + 14}" for 27), so the
question says "plus" in words rather than giving the model an expression it could copy.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

QUESTION = "What is {a} plus {b}? Write the final answer as \\boxed{{answer}}."


def problems(count: int, max_operand: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        rows.append({"prompt": QUESTION.format(a=a, b=b), "label": str(a + b)})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)  # never a half-written file under the final name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for train.jsonl and eval.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="training prompts")
    parser.add_argument("--eval", type=int, default=64, help="held-out evaluation prompts")
    parser.add_argument("--max-operand", type=int, default=20, help="operands are drawn from 1..N")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for flag, value in (("--train", args.train), ("--eval", args.eval), ("--max-operand", args.max_operand)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    # different seeds: the eval set is drawn independently (with small operands some questions repeat)
    write_jsonl(args.out / "train.jsonl", problems(args.train, args.max_operand, args.seed))
    write_jsonl(args.out / "eval.jsonl", problems(args.eval, args.max_operand, args.seed + 1))
    print(f"make_prompts: wrote {args.train} train and {args.eval} eval addition prompts "
          f"(operands 1..{args.max_operand}) to {args.out}")


if __name__ == "__main__":
    main()
