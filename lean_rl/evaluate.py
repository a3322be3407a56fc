"""Evaluate a checkpoint without training: served on SGLang engines, scored on the evaluation sets.

    python -m lean_rl.evaluate --hf-checkpoint DIR --eval-config eval.yaml --eval-output scores.json \
        [--eval-pass-k 1 4] [--n-samples-per-eval-prompt 4] [--rm-type ... | --custom-rm-path ...] [run flags]
    python -m lean_rl.evaluate --load CKPT_ROOT [--hf-checkpoint DIR] --eval-config eval.yaml --eval-output ...

One line per set on stdout (pass@k, mean reward), the JSON file --eval-output. Every other flag is a
run's (engines, sampling, reward, --rm-hf-checkpoint, judges); see docs/evaluate.md and
lean_rl/evaluate_checkpoint.py.
"""

from __future__ import annotations

import sys

from lean_rl.cli import run_command
from lean_rl.evaluate_checkpoint import evaluate_command
from lean_rl.utils.metrics import setup_logging


def main(argv: list[str]) -> None:
    setup_logging()
    evaluate_command(argv)


if __name__ == "__main__":  # the guard matters: engine actors may re-import __main__
    sys.exit(run_command("lean_rl.evaluate", main, sys.argv[1:]))  # a user error: one line, exit 2
