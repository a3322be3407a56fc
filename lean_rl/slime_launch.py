"""Run a slime launch script's command on lean_rl: its `python3 train.py FLAGS` (or `train_async.py`)
becomes `python3 -m lean_rl.slime_launch train.py FLAGS`, nothing else changes.

    python -m lean_rl.slime_launch train.py --hf-checkpoint DIR --rollout-batch-size 8 --use-kl-loss ...

The flags are slime's, read through lean_rl/slime_flags.py: each is passed on, mapped to lean_rl's,
accepted with a one-line notice, or refused with one line naming the lean_rl way; slime's defaults
hold where they differ from lean_rl's. train_async.py runs lean_rl.train_async (--async-mode one-step,
or full with slime's fully-async rollout function). docs/slime_flags.md lists every flag."""

from __future__ import annotations

import logging
import os
import sys

from lean_rl import train, train_async
from lean_rl.cli import run_command
from lean_rl.options import ConfigError
from lean_rl.slime_flags import LAUNCHERS, translate
from lean_rl.utils.metrics import setup_logging

logger = logging.getLogger("lean_rl.slime_launch")


def main(argv: list[str]) -> None:
    setup_logging()
    if not argv or argv[0].startswith("--"):
        raise ConfigError(f"name slime's launcher first: python -m lean_rl.slime_launch {' | '.join(LAUNCHERS)} FLAGS")
    translation = translate(argv[0], argv[1:])
    for line in translation.notices:
        logger.warning(line)
    os.environ.update(translation.env)  # wandb's settings, for this process and those it starts
    (train_async.main if translation.asynchronous else train.main)(translation.argv)


if __name__ == "__main__":  # the guard matters: checkpointing spawns processes that re-import __main__
    sys.exit(run_command("lean_rl", main, sys.argv[1:]))
