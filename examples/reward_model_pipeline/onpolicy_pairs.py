"""Preference pairs from the GRPO policy's own samples, for the reward model's next round (RLHF's iterated
reward model: InstructGPT collected new comparisons of the current policy's outputs and refitted its
reward model on all of them). The rule reward plays the human labeller, exactly as in make_pairs.py: it
labels each pair (the higher one chosen) and is then put away; the reward model and the policy are still
trained on pairs and scores alone.

    python examples/reward_model_pipeline/onpolicy_pairs.py --rollouts 'OUT/grpo/rollouts/{rollout_id}.jsonl' \
        --steps 0 10 --out OUT/data/onpolicy_1.jsonl --pairs-per-group 8 --seed 0

Reads the groups the run trained on (--save-debug-rollout-data files of steps [FIRST, LAST)), each sample's
rule reward from its reward dict (metadata["rewards"]["rule"], rm_with_hidden_rule.py), and pairs two
samples of one group (same prompt) whose rule rewards differ by at least --min-gap, at most
--pairs-per-group a group. The responses are written as the token ids the policy sampled (the reward
model served by the run scores those ids: a decoded byte token would read back as other tokens). Failed
samples (no reward) are left out. Same arguments -> the same file."""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

from lean_rl.debug_rollout import load_debug_rollout
from lean_rl.sample import Sample, Status


def rule_of(sample: Sample) -> float:
    rewards = sample.metadata.get("rewards")
    if not isinstance(rewards, dict) or "rule" not in rewards:
        raise ValueError(f"sample {sample.index}: no rule reward in metadata['rewards'] (run with "
                         "--custom-rm-path rm_with_hidden_rule.reward)")
    return float(rewards["rule"])


def group_pairs(group: list[Sample], rng: random.Random, pairs_per_group: int, min_gap: float) -> list[dict]:
    scored = [(s, rule_of(s)) for s in group if s.status != Status.FAILED and s.response_length > 0]
    candidates = [(a, b) for a, b in itertools.combinations(scored, 2) if abs(a[1] - b[1]) >= min_gap]
    rows = []
    for a, b in rng.sample(candidates, min(pairs_per_group, len(candidates))):
        (chosen, r_chosen), (rejected, r_rejected) = sorted((a, b), key=lambda x: -x[1])
        rows.append({"prompt": chosen.prompt, "chosen": list(chosen.response_tokens),
                     "rejected": list(rejected.response_tokens), "label": chosen.label,
                     "chosen_rule_reward": r_chosen, "rejected_rule_reward": r_rejected})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", required=True, help="the --save-debug-rollout-data template ({rollout_id})")
    parser.add_argument("--steps", required=True, type=int, nargs=2, metavar=("FIRST", "LAST"),
                        help="the rollouts of steps FIRST .. LAST-1")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--pairs-per-group", type=int, default=8)
    parser.add_argument("--min-gap", type=float, default=0.1,
                        help="the least rule-reward gap of a pair (0.1: two tokens of 12)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    first, last = args.steps
    if not 0 <= first < last:
        raise SystemExit(f"--steps {first} {last}: needs 0 <= FIRST < LAST")
    rng = random.Random(args.seed)
    rows = [row for step in range(first, last) for group in load_debug_rollout(args.rollouts, step)
            for row in group_pairs(group, rng, args.pairs_per_group, args.min_gap)]
    if not rows:
        raise SystemExit(f"{args.rollouts} steps {first}-{last - 1}: no two samples of a group differ by "
                         f">= {args.min_gap} in rule reward: no pairs")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gap = sum(r["chosen_rule_reward"] - r["rejected_rule_reward"] for r in rows) / len(rows)
    print(f"wrote {args.out}: {len(rows)} pairs from the policy's samples of steps {first}-{last - 1} "
          f"(mean rule-reward gap {gap:.2f})")


if __name__ == "__main__":
    main()
