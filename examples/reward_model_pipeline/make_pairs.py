"""Preference pairs for the toy task (lean_rl/testing/toy_task.py: "answer in digits" / "answer in letters"),
built from its prompts with no model: two random responses per pair, the one the rule reward scores higher
chosen. The reward model and DPO learn only from these pairs; the rule itself is never shown to them.

    python examples/reward_model_pipeline/make_pairs.py --model MODEL_DIR --prompts train.jsonl \
        --out pairs.jsonl --pairs-per-prompt 4 --seed 0

A response is up to --max-tokens pieces drawn, each, from the tokens of the kind the prompt asks for, of
the other kind, or from the rest of the vocabulary, in proportions drawn per response (so that the pairs
cover the whole range a policy passes through, from a random one's ~0.1 to 1.0). The pairs are text, and a
quarter of the tiny vocabulary (128 tokens) are single bytes of UTF-8 characters, which no text holds
alone (decoded alone each is U+FFFD, which reads back as other tokens): the rest of the vocabulary is
therefore the tokens that read back as themselves plus random non-ASCII characters, whose bytes are those
tokens. Without them the reward model never sees a byte token, and GRPO found that out: its policy drifted
to byte tokens the reward model scored above digits (rule reward 0.0, README). Half the responses repeat 1-3 pieces
(a policy that collapses onto an answer repeats itself: the main job ends at " 23 23 23 ..."). Half end
with the tokenizer's EOS, as a finished answer does (one cut at the budget has none: the reward model
scores the last token, so both must be seen); an empty one is the EOS alone. Its rule reward is toy_task.kind_fraction of the text as the
tokenizer reads it back, the reward the main job trains on. A pair's two rewards differ by at least
--min-gap. Same arguments -> the same file."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.testing.toy_task import KINDS, kind_fraction


def token_pools(tokenizer) -> dict[str, list[int]]:
    """Token ids by kind ("digits", "letters") and "other" (neither, not special)."""
    special = set(tokenizer.all_special_ids)
    pools: dict[str, list[int]] = {kind: [] for kind in [*KINDS, "other"]}
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if token_id in special or "\ufffd" in text:  # a byte of a character: non_ascii_character covers those
            continue
        kind = next((k for k, pattern in KINDS.items() if pattern.fullmatch(text)), "other")
        pools[kind].append(token_id)
    return pools


# code points whose UTF-8 bytes (2 to 4 of them) span the byte tokens: Latin-1 and Latin Extended, Greek and
# Cyrillic, CJK, emoji
_NON_ASCII = ((0xA1, 0x24F), (0x370, 0x4FF), (0x4E00, 0x9FFF), (0x1F300, 0x1F64F))


def non_ascii_character(rng: random.Random) -> str:
    low, high = rng.choice(_NON_ASCII)
    return chr(rng.randint(low, high))


def rule_reward(tokenizer, text: str, kind: str) -> float:
    """The main job's reward of `text` as a response: the share of its (non-special) tokens of `kind`."""
    special = set(tokenizer.all_special_ids)
    ids = [t for t in tokenizer(text, add_special_tokens=False)["input_ids"] if t not in special]
    return kind_fraction([tokenizer.decode([t]) for t in ids], kind)


def random_response(rng: random.Random, tokenizer, pools: dict[str, list[int]], kind: str, max_tokens: int) -> str:
    other_kind = next(k for k in KINDS if k != kind)
    asked, wrong = rng.random(), rng.random()  # this response's mix: asked kind, then the other kind, else the rest
    length = rng.randint(0, max_tokens)
    pieces: list[str] = []
    palette = rng.randint(1, 3) if rng.random() < 0.5 else None  # half repeat 1-3 pieces, as a collapsing policy does
    for _ in range(length):
        if palette is not None and len(pieces) >= palette:
            pieces.append(rng.choice(pieces[:palette]))
            continue
        if rng.random() < asked:
            pieces.append(tokenizer.decode([rng.choice(pools[kind])]))
        elif rng.random() < wrong:
            pieces.append(tokenizer.decode([rng.choice(pools[other_kind])]))
        elif rng.random() < 0.3:  # byte tokens: 128 of the 512
            pieces.append(non_ascii_character(rng))
        else:
            pieces.append(tokenizer.decode([rng.choice(pools["other"])]))
    text = "".join(pieces)
    return text + tokenizer.eos_token if length == 0 or rng.random() < 0.5 else text


def make_pairs(tokenizer, prompts: list[dict], pairs_per_prompt: int, max_tokens: int, min_gap: float,
               seed: int) -> list[dict]:
    rng = random.Random(seed)
    pools = token_pools(tokenizer)
    rows = []
    for prompt in prompts:
        kind = prompt["label"]
        for _ in range(pairs_per_prompt):
            while True:
                a, b = (random_response(rng, tokenizer, pools, kind, max_tokens) for _ in range(2))
                ra, rb = rule_reward(tokenizer, a, kind), rule_reward(tokenizer, b, kind)
                if abs(ra - rb) >= min_gap:
                    break
            (chosen, r_chosen), (rejected, r_rejected) = sorted(((a, ra), (b, rb)), key=lambda x: -x[1])
            rows.append({"prompt": prompt["prompt"], "chosen": chosen, "rejected": rejected, "label": kind,
                         "chosen_rule_reward": r_chosen, "rejected_rule_reward": r_rejected})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the HF directory whose tokenizer the policy uses")
    parser.add_argument("--prompts", required=True, type=Path, help="the toy task's jsonl (prompt, label)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--pairs-per-prompt", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=12, help="the policy's --rollout-max-response-len")
    parser.add_argument("--min-gap", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    for number, prompt in enumerate(prompts, 1):
        if prompt.get("label") not in KINDS or not isinstance(prompt.get("prompt"), str):
            raise SystemExit(f"{args.prompts} row {number}: needs 'prompt' (text) and 'label' (one of {sorted(KINDS)})")
    rows = make_pairs(load_tokenizer(args.model), prompts, args.pairs_per_prompt, args.max_tokens, args.min_gap,
                      args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gap = sum(r["chosen_rule_reward"] - r["rejected_rule_reward"] for r in rows) / len(rows)
    print(f"wrote {args.out}: {len(rows)} pairs from {len(prompts)} prompts (mean rule-reward gap {gap:.2f})")


if __name__ == "__main__":
    main()
