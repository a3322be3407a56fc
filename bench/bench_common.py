"""What every bench script shares: its parser (one-line errors, `--quick`, `--json PATH`), the rows it
hands to bench/run_all.py, and how it ends on bad input (`bench/NAME.py: error: ...`, status 2).

A row is one measured figure beside its floor: {"what", "figure", "floor", "ratio", "goal", "command"},
strings for display except `ratio` (a number, or None where there is none). `goal` is the target the
design states for that ratio, or NO_GOAL. Scripts import this as `bench_common` (bench/ is on sys.path
when a script runs as `python bench/NAME.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from goals import WHY
from lean_rl.cli import DEBUG_HELP, ArgumentParser, run_command
from lean_rl.options import ConfigError

ROW_KEYS = ("what", "figure", "floor", "ratio", "goal", "command")  # the table's columns (and "met": goals.py)
PHYSICAL = "physical_floor"  # and three more keys of every row, not shown: see row()
NOISE = "floor_noise"
NO_GOAL = "—"


def bench_parser(name: str, doc: str, quick: dict[str, object]) -> ArgumentParser:
    """The parser of bench/NAME.py; `quick` holds the option values --quick sets (flags given win)."""
    parser = ArgumentParser(prog=f"bench/{name}.py", description=doc,
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=DEBUG_HELP)
    sizes = " ".join(f"--{key.replace('_', '-')} {' '.join(map(str, value)) if isinstance(value, list) else value}"
                     for key, value in quick.items())
    parser.add_argument("--quick", action="store_true",
                        help=f"the same comparison at smaller sizes, for bench/run_all.py --quick: {sizes}")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as a list of rows "
                        "{what, figure, floor, ratio, goal, command} (bench/run_all.py reads them)")
    parser.set_defaults(_quick_values=quick)
    return parser


def parse_bench_args(parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, with --quick's values as the defaults when --quick is given."""
    quick = parser.get_default("_quick_values")
    if "--quick" in argv:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)


def at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= low (a bad value ends as one line naming the flag)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value
    return parse


def command_line(name: str, argv: list[str]) -> str:
    """How to run this measurement again: the script and its flags, without --json PATH."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--json":
            skip = True
        elif not arg.startswith("--json="):
            kept.append(arg)
    return shlex.join(["python", f"bench/{name}.py", *kept])


def row(what: str, figure: str, floor: str, ratio: float | None, goal: str, command: str,
        physical: bool = False, noise: float = 0.0, why: str | None = None) -> dict:
    """`physical`: the floor is the simplest code that moves the same bytes through the same medium
    (bench/floors.py) and `ratio` is ours' cost over the floor's, so it cannot fall below 1 unless the
    floor is broken (bench/run_all.py refuses such a row). `noise`: the floor's own spread between the
    rounds of this run, (slowest - fastest) / fastest; a ratio below 1 by less than it is a tie, not a
    broken floor (ours at the floor: the engine, not our code, sets the time); it is also the margin
    within which a missed goal is a tie (goals.py). `why`: where the ratio misses its goal, the reason
    the script measured in the same run that the goal is out of reach on this machine (goals.verdict)."""
    return {"what": what, "figure": figure, "floor": floor, "ratio": None if ratio is None else float(ratio),
            "goal": goal, "command": command, PHYSICAL: physical, NOISE: float(noise), WHY: why}


def broken_floor(r: dict) -> str | None:
    """Why a row's physical floor cannot be one (ours beat it by more than the floor's own noise), or None."""
    if r.get(PHYSICAL) and r["ratio"] is not None and r["ratio"] < 1.0 - r.get(NOISE, 0.0):
        within = f" (more than the floor's spread between rounds, {r[NOISE]:.2g})" if r.get(NOISE) else ""
        return (f"broken floor: ours / floor = {r['ratio']:.3g} < 1{within} for {r['what']!r}; its floor "
                f"({r['floor']}) measured another implementation, not the limit")
    return None


def write_rows(path: str | None, rows: list[dict]) -> None:
    if path:
        Path(path).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


def run_bench(name: str, main: Callable[[list[str]], int | None]) -> None:
    """The `if __name__ == "__main__"` of bench/NAME.py."""
    sys.exit(run_command(f"bench/{name}.py", main, sys.argv[1:]))


def work_dir_with_ray(work_dir: str | None, prefix: str) -> Path:
    """The run's --work-dir (a temporary directory when None; refused when it is a file), with
    OMP_NUM_THREADS 1 unless set and a 2-CPU local Ray started: what the Megatron + SGLang benches need."""
    if work_dir and Path(work_dir).exists() and not Path(work_dir).is_dir():
        raise ConfigError(f"--work-dir {work_dir}: exists and is not a directory")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from lean_rl.utils.ray_utils import init_ray

    init_ray(num_cpus=2)
    return Path(work_dir or tempfile.mkdtemp(prefix=prefix))
