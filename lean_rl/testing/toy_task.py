"""A task a randomly initialised tiny model can learn by RL in minutes on 2 CPU cores.

"Answer in digits" / "answer in letters": the reward is the fraction of the response's tokens of the
kind the prompt asks for (the tiny tokenizer has 47 digit tokens and 52 single-letter tokens of 512,
so a random policy scores about 0.1, and the ceiling is 1.0). Half the prompts ask for each kind, so
the policy must read its prompt, not just collapse onto one kind of output. Hard enough to need
real credit assignment, easy enough for a 190k-parameter model: it shows that rewards, advantages,
the loss, the optimizer, weight sync and the engines' sampling all connect, which is what the main
job and the e2e tests are for.

    python -m lean_rl.testing.toy_task --out DIR     # writes DIR/train.jsonl and DIR/eval.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.sample import Sample

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config

_WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hello world".split()
KINDS = {"digits": re.compile(r"\s*\d+\s*"), "letters": re.compile(r"\s?[a-z]")}


def write_dataset(path: str | Path, num_prompts: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(num_prompts):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5)))
        kind = sorted(KINDS)[i % len(KINDS)]
        rows.append({"prompt": f"answer in {kind}: {words}", "label": kind, "metadata": {"id": i}})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def kind_fraction(token_texts: list[str], kind: str) -> float:
    """Fraction of the tokens (as decoded one by one) that are of `kind`."""
    if kind not in KINDS:
        raise ValueError(f"label {kind!r}: expected one of {sorted(KINDS)}")
    if not token_texts:
        return 0.0
    return sum(bool(KINDS[kind].fullmatch(t)) for t in token_texts) / len(token_texts)


async def kind_fraction_reward(cfg: Config, sample: Sample) -> float:
    """--custom-rm-path lean_rl.testing.toy_task.kind_fraction_reward"""
    tokenizer = load_tokenizer(cfg.engines.model_path)
    tokens = [t for t in sample.response_tokens if t not in tokenizer.all_special_ids]
    return kind_fraction([tokenizer.decode([t]) for t in tokens], sample.label)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-train", type=int, default=512)
    parser.add_argument("--num-eval", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    write_dataset(out / "train.jsonl", args.num_train, args.seed)
    write_dataset(out / "eval.jsonl", args.num_eval, args.seed + 1)
    print(f"wrote {out / 'train.jsonl'} ({args.num_train} prompts) and {out / 'eval.jsonl'} ({args.num_eval})")


if __name__ == "__main__":
    main()


async def long_tail_generate(cfg: Config, sample: Sample, sampling_params: dict) -> Sample:
    """--custom-generate-function-path for benchmarks: the default generate with a long-tailed
    response length (Pareto, alpha 1.2, from 8 tokens up to --rollout-max-response-len) fixed per
    sample index, and ignore_eos, so that sync and async runs see the same workload."""
    from lean_rl.rollout.default import generate

    rng = random.Random(sample.index)
    length = min(int(8 * rng.paretovariate(1.2)), cfg.rollout.sampling.max_response_len)
    return await generate(cfg, sample, {**sampling_params, "max_new_tokens": length, "ignore_eos": True})
