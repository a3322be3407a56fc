"""The toy task's reward of a distillation run's own samples, step by step, read from the rollouts the run
dumped (--save-debug-rollout-data DIR/{rollout_id}.jsonl). The run itself trains on no reward: this
scores what the student generated, after the fact, with the main job's reward (toy_task.kind_fraction).

    python examples/distillation/task_reward.py --model STUDENT_HF_DIR RUN_ROLLOUTS_DIR [...]
prints one row per step: the step, then each run's mean task reward and its samples' mean response entropy
proxy (the fraction of distinct responses in the step: a collapsed student repeats itself)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.testing.toy_task import kind_fraction


def step_rewards(rollouts: Path, tokenizer) -> list[tuple[float, float]]:
    """(mean task reward, fraction of distinct responses) per dumped step, in step order."""
    special = set(tokenizer.all_special_ids)
    out = []
    files = sorted(rollouts.glob("*.jsonl"), key=lambda p: int(p.stem))
    if not files:
        raise SystemExit(f"{rollouts}: no dumped rollouts (*.jsonl); was the run given --save-debug-rollout-data?")
    for path in files:
        samples = [s for line in path.read_text().splitlines() for s in json.loads(line)]
        rewards, responses = [], set()
        for s in samples:
            response = [t for t in s["tokens"][len(s["tokens"]) - s["response_length"]:] if t not in special]
            rewards.append(kind_fraction([tokenizer.decode([t]) for t in response], s["label"]))
            responses.add(tuple(response))
        out.append((sum(rewards) / len(rewards), len(responses) / len(samples)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the student's HF directory (its tokenizer)")
    parser.add_argument("runs", nargs="+", type=Path, help="rollout dump directories, one per run")
    args = parser.parse_args()
    tokenizer = load_tokenizer(str(args.model))
    curves = [step_rewards(run, tokenizer) for run in args.runs]
    print("| step | " + " | ".join(f"{run.parent.name}: task reward | distinct" for run in args.runs) + " |")
    print("|---|" + "---|---|" * len(args.runs))
    for step in range(max(len(c) for c in curves)):
        cells = [f"{c[step][0]:.2f} | {c[step][1]:.2f}" if step < len(c) else " | " for c in curves]
        print(f"| {step} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
