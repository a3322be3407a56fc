"""The example's two yardsticks, on HF checkpoints (transformers, CPU), the same for every model:

    python examples/reward_model_pipeline/evaluate.py rm-accuracy --rm RM_HF_DIR --pairs heldout.jsonl
        a reward model's share of held-out pairs whose chosen response it scores higher, and the mean margin
    python examples/reward_model_pipeline/evaluate.py rule-reward --policy HF_DIR [HF_DIR ...] --prompts eval.jsonl
        each policy's mean rule reward (toy_task.kind_fraction, the main job's reward) over --samples
        samples per prompt at --temperature, --max-new-tokens tokens at most: the policy's own samples

Each prints one JSON line per model (and --out FILE appends them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers

from lean_rl.testing.toy_task import kind_fraction


def rm_accuracy(rm_dir: Path, pairs: Path) -> dict:
    """Held-out pair accuracy of a sequence-classification reward model, scored as lean_rl trained it
    (prompt + response tokens, no special tokens added, the score at the last token)."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(rm_dir)

    def score(prompt: str, response: str | list[int]) -> float:  # text, or a policy's token ids (onpolicy_pairs.py)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] + (
            response if isinstance(response, list) else tokenizer(response, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            return float(model(torch.tensor([ids])).logits[0, 0])

    rows = [json.loads(line) for line in pairs.read_text().splitlines() if line.strip()]
    margins = [score(r["prompt"], r["chosen"]) - score(r["prompt"], r["rejected"]) for r in rows]
    return {"model": str(rm_dir), "pairs": len(rows), "pairs_file": str(pairs),
            "accuracy": sum(m > 0 for m in margins) / len(rows),
            "mean_margin": sum(margins) / len(rows)}


def rule_reward(policy_dir: Path, prompts: Path, samples: int, max_new_tokens: int, temperature: float,
                seed: int) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(policy_dir)
    special = set(tokenizer.all_special_ids)
    rows = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    torch.manual_seed(seed)
    rewards = []
    for row in rows:
        ids = torch.tensor([tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        for sequence in out[:, ids.shape[1]:].tolist():
            if tokenizer.eos_token_id in sequence:
                sequence = sequence[:sequence.index(tokenizer.eos_token_id)]
            tokens = [t for t in sequence if t not in special]
            rewards.append(kind_fraction([tokenizer.decode([t]) for t in tokens], row["label"]))
    return {"model": str(policy_dir), "prompts": len(rows), "samples": len(rewards),
            "rule_reward": sum(rewards) / len(rewards)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    acc = sub.add_parser("rm-accuracy")
    acc.add_argument("--rm", required=True, type=Path)
    acc.add_argument("--pairs", required=True, type=Path)
    rule = sub.add_parser("rule-reward")
    rule.add_argument("--policy", required=True, type=Path, nargs="+")
    rule.add_argument("--prompts", required=True, type=Path)
    rule.add_argument("--samples", type=int, default=4)
    rule.add_argument("--max-new-tokens", type=int, default=12)
    rule.add_argument("--temperature", type=float, default=1.0)
    rule.add_argument("--seed", type=int, default=0)
    for p in (acc, rule):
        p.add_argument("--out", type=Path, help="append the JSON lines to this file")
    args = parser.parse_args(argv)
    if args.what == "rm-accuracy":
        results = [rm_accuracy(args.rm, args.pairs)]
    else:
        results = [rule_reward(p, args.prompts, args.samples, args.max_new_tokens, args.temperature, args.seed)
                   for p in args.policy]
    for result in results:
        print(json.dumps(result))
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
