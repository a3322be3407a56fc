"""A verifiers environment of the toy task (lean_rl/testing/toy_task.py), written with the verifiers
library only: a SingleTurnEnv over a dataset of questions ("answer in digits: the cat sat") and a
rubric whose reward is the fraction of the answer's tokens of the asked kind (a random tiny policy
scores about 0.1). lean_rl trains on it as it is:

    --verifiers-env toy_env.load_environment

TOY_ENV_MODEL names the tokenizer the rubric splits answers with (the served model's);
TOY_ENV_PROMPTS the number of questions (default 512); TOY_ENV_SYSTEM=1 adds the system prompt below."""

import os
import random
import re

import verifiers as vf
from datasets import Dataset
from transformers import AutoTokenizer

WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hello world".split()
KINDS = {"digits": re.compile(r"\s*\d+\s*"), "letters": re.compile(r"\s?[a-z]")}
# No system prompt by default: the tiny random model reads the question's kind word more easily in a short
# prompt (with this system prompt the same run collapsed onto one kind for every question: reward 0.5;
# without it the reward reaches 1.0, examples/verifiers_env/README.md). TOY_ENV_SYSTEM=1 adds it.
SYSTEM = "You answer in the kind of characters the question asks for."


def questions(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = sorted(KINDS)[i % 2]
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        rows.append({"question": f"answer in {kind}: {words}", "answer": kind})
    return Dataset.from_list(rows)


def load_environment() -> vf.Environment:
    tokenizer = AutoTokenizer.from_pretrained(os.environ["TOY_ENV_MODEL"])
    special = set(tokenizer.all_special_ids)

    def kind_fraction(completion, answer, **kwargs) -> float:
        """The share of the answer's tokens of the kind the question asks for."""
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        ids = [t for t in tokenizer(text or "", add_special_tokens=False)["input_ids"] if t not in special]
        pieces = [tokenizer.decode([t]) for t in ids]
        return sum(bool(KINDS[answer].fullmatch(p)) for p in pieces) / len(pieces) if pieces else 0.0

    def answer_length(completion, **kwargs) -> float:
        """A metric only (weight 0): the answer's characters."""
        return float(len(completion[-1]["content"] or "")) if isinstance(completion, list) else 0.0

    rubric = vf.Rubric(funcs=[kind_fraction, answer_length], weights=[1.0, 0.0])
    system = SYSTEM if os.environ.get("TOY_ENV_SYSTEM") == "1" else None
    return vf.SingleTurnEnv(dataset=questions(int(os.environ.get("TOY_ENV_PROMPTS", "512"))),
                            system_prompt=system, rubric=rubric)
