"""Local preference pairs for tinker-cookbook's DPO (tinker_cookbook.preference.train_dpo), in the jsonl
format its ComparisonBuilderFromJsonl reads (one LabeledComparison a line: `comparison` with
`prompt_conversation`, `completion_A`, `completion_B`; `label` "A" or "B").

The rule: the user asks "answer in digits: <words>" or "answer in letters: <words>"; the chosen answer
follows it (3 to 6 single digits, or single letters), the rejected one breaks it (the other kind). Which
of A and B is the chosen one is drawn per pair, so the label carries the preference, not the position.
At step 0 the policy is the reference (DPO loss log 2, margin 0, accuracy by rounding noise); to learn
the preference the model must read the instruction, since half the pairs prefer each kind."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

_WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hello world".split()
_ALPHABETS = {"digits": string.digits, "letters": string.ascii_lowercase}


def _answer(rng: random.Random, kind: str) -> list[dict[str, str]]:
    text = " ".join(rng.choice(_ALPHABETS[kind]) for _ in range(rng.randint(3, 6)))
    return [{"role": "assistant", "content": text}]


def write_pairs(path: Path, num_pairs: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(num_pairs):
        kind, other = ("digits", "letters") if i % 2 == 0 else ("letters", "digits")
        prompt = f"answer in {kind}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5)))
        chosen, rejected = _answer(rng, kind), _answer(rng, other)
        label = rng.choice("AB")
        a, b = (chosen, rejected) if label == "A" else (rejected, chosen)
        rows.append({"comparison": {"prompt_conversation": [{"role": "user", "content": prompt}],
                                    "completion_A": a, "completion_B": b}, "label": label})
    rng.shuffle(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
