"""How a lean_rl command ends on bad input: one line on stderr, `PROG: error: MESSAGE`, and exit status 2,
the convention argparse already follows for a malformed flag. A user error is one the user can fix by
changing a flag, a file, a dataset, a model directory, a checkpoint or a hook: its message names that
thing, so the traceback behind it only hides it. `--debug` anywhere on the command line (or
LEAN_RL_DEBUG=1) shows the traceback too. Errors of lean_rl itself (anything not listed as a user error)
keep their traceback.

    sys.exit(run_command("lean_rl", main, sys.argv[1:]))
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from lean_rl.options import ConfigError

DEBUG_FLAG = "--debug"
DEBUG_ENV = "LEAN_RL_DEBUG"
DEBUG_HELP = f"{DEBUG_FLAG}: on a user error, show the traceback as well (or {DEBUG_ENV}=1)"


def debug_requested(argv: Sequence[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_command(prog: str, main: Callable[[list[str]], int | None], argv: Sequence[str],
                user_errors: tuple[type[BaseException], ...] = (ConfigError,)) -> int:
    """`main(argv without --debug)`; a `user_errors` exception becomes `prog: error: ...` and status 2.
    Returns main's status (None counts as 0); SystemExit (argparse, signals) passes through."""
    debug = debug_requested(argv)
    try:
        return main([a for a in argv if a != DEBUG_FLAG]) or 0
    except user_errors as err:
        if debug:
            raise
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2


def one_line(err: BaseException) -> str:
    """The message, on one line (a multi-line message keeps its lines, joined by ' | ')."""
    text = str(err).strip() or type(err).__name__
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a malformed flag ends with the one error line alone: the usage of a
    command with two hundred flags would bury it (--help shows them)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")
