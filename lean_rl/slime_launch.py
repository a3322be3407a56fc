"""Run a slime launch script's command on lean_rl: its `python3 train.py FLAGS` (or `train_async.py`)
becomes `python3 -m lean_rl.slime_launch train.py FLAGS`, nothing else changes.

    python -m lean_rl.slime_launch train.py --hf-checkpoint DIR --rollout-batch-size 8 --use-kl-loss ...

The flags are slime's, read through lean_rl/slime_flags.py: each is passed on, mapped to lean_rl's,
accepted with a one-line notice, or refused with one line naming the lean_rl way; slime's defaults
hold where they differ from lean_rl's. train_async.py runs lean_rl.train_async (--async-mode one-step,
or full with slime's fully-async rollout function). docs/slime_flags.md lists every flag.

No flag is lost: the whole slime command line also travels as --slime-argv, from which the `args` of
slime functions is slime's own namespace (lean_rl/slime_namespace.py); a flag slime's parser knows
and lean_rl's does not (a Megatron flag no slime script passes) reaches `args` only, with a notice.
slime's --sglang-<flag> spellings that SGLang 0.5.23 renamed are respelled first (slime_engine_flags)."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from dataclasses import dataclass

from lean_rl import train, train_async
from lean_rl.cli import run_command
from lean_rl.config import build_parser
from lean_rl.options import ConfigError
from lean_rl.slime_engine_flags import respell
from lean_rl.slime_flags import LAUNCHERS, PASSED_THROUGH, SLIME_FLAGS, split_flags, translate
from lean_rl.slime_namespace import defined_flags, slime_namespace
from lean_rl.utils.metrics import setup_logging

logger = logging.getLogger("lean_rl.slime_launch")


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]  # lean_rl's command line, --slime-argv included
    asynchronous: bool
    notices: list[str]  # one line each, logged at start-up
    env: dict[str, str]
    slime_argv: list[str]  # what slime's parser reads (`args`), respelled for SGLang 0.5.23


def plan(script: str, argv: list[str]) -> LaunchPlan:
    slime_argv, notices = respell(argv)
    lean_flags, known_to_slime = _lean_flags(), defined_flags()
    kept: list[str] = []
    for flag, values in split_flags(slime_argv):
        if (flag in known_to_slime and flag not in SLIME_FLAGS and flag not in lean_flags
                and not flag.startswith(PASSED_THROUGH)):
            notices.append(f"slime flag {flag} reaches slime's args only: lean_rl's run has no such setting")
            continue
        kept += [flag, *values]
    translation = translate(script, kept)
    slime_namespace(slime_argv)  # slime's parser refuses a value now, not at the first slime function
    return LaunchPlan(argv=[*translation.argv, "--slime-argv", json.dumps(slime_argv)],
                      asynchronous=translation.asynchronous, notices=notices + translation.notices,
                      env=translation.env, slime_argv=slime_argv)


@functools.lru_cache(maxsize=1)
def _lean_flags() -> frozenset[str]:
    return frozenset(option for action in build_parser()._actions for option in action.option_strings)


def main(argv: list[str]) -> None:
    setup_logging()
    if not argv or argv[0].startswith("--"):
        raise ConfigError(f"name slime's launcher first: python -m lean_rl.slime_launch {' | '.join(LAUNCHERS)} FLAGS")
    launch = plan(argv[0], argv[1:])
    for line in launch.notices:
        logger.warning(line)
    os.environ.update(launch.env)  # wandb's settings, for this process and those it starts
    (train_async.main if launch.asynchronous else train.main)(launch.argv)


if __name__ == "__main__":  # the guard matters: checkpointing spawns processes that re-import __main__
    sys.exit(run_command("lean_rl", main, sys.argv[1:]))
