"""tinker-cookbook's rl_loop recipe (tinker_cookbook/recipes/rl_loop.py, cookbook 0.6.1) run by its own
`main` on local data. Three things the recipe hard-wires, none of them in its Config:

- rl_loop.py:108  `datasets.load_dataset("openai/gsm8k", "main")`: GSM8K from the Hugging Face hub;
- rl_loop.py:102  `model_info.get_recommended_renderer_name(config.model_name)`: a renderer only for the
  hub names it knows (a local checkpoint path is not one);
- rl_loop.py:61   `get_reward`: 1 if the response's \\boxed{} equals GSM8K's "#### N", read at :235.

`local_rl_loop` swaps these three names in rl_loop's own module namespace for the run (and restores
them): `datasets.load_dataset` reads a local jsonl in GSM8K's shape (columns `question`, `answer`), the
renderer is the one given, and the reward is the toy task's (lean_rl/testing/toy_task.py): the
`question` is "answer in digits: ..." or "answer in letters: ...", the `answer` the kind, the reward the
fraction of the response's tokens of that kind. Why the toy task and not GSM8K-style numbers: a randomly
initialised tiny model never writes "\\boxed{N}" in 8 tokens, so every group's reward is 0, every
advantage 0, and rl_loop skips every step (rl_loop.py:243). Everything else (sampling through a fresh
sampler each step, group-centred advantages, the datums, forward_backward with the configured loss,
optim_step, the final checkpoint) is the recipe's own code.
"""

from __future__ import annotations

import contextlib
import json
import random
import types
from collections.abc import Iterator
from pathlib import Path

import datasets
from tinker_cookbook.recipes import rl_loop
from tinker_cookbook.tokenizer_utils import get_tokenizer

from lean_rl.testing.toy_task import KINDS, kind_fraction

_WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hello world".split()


def write_toy_gsm8k(path: Path, num_rows: int, seed: int) -> Path:
    """The toy task as rows of GSM8K's shape: `question` the prompt, `answer` the kind it asks for."""
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    rows = [{"question": f"answer in {kinds[i % 2]}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5))),
             "answer": kinds[i % 2]} for i in range(num_rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@contextlib.contextmanager
def local_rl_loop(data_path: Path, renderer_name: str, model: str) -> Iterator[None]:
    """rl_loop with its dataset, renderer and reward swapped (module docstring); restored on exit."""
    tokenizer = get_tokenizer(model)
    special = set(getattr(tokenizer, "all_special_ids", []))

    def load_dataset(*_args, **_kwargs) -> datasets.DatasetDict:
        return datasets.load_dataset("json", data_files={"train": str(data_path)})

    def toy_reward(response: str, answer: str) -> float:
        tokens = [t for t in tokenizer.encode(response, add_special_tokens=False) if t not in special]
        return kind_fraction([tokenizer.decode([t]) for t in tokens], answer)

    swaps = {"datasets": types.SimpleNamespace(load_dataset=load_dataset, DatasetDict=datasets.DatasetDict),
             "model_info": types.SimpleNamespace(get_recommended_renderer_name=lambda _name: renderer_name),
             "get_reward": toy_reward}
    saved = {name: getattr(rl_loop, name) for name in swaps}
    for name, value in swaps.items():
        setattr(rl_loop, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(rl_loop, name, value)
