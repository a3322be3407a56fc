"""Every bench script, one after another, into ONE markdown table (on stdout and in bench/RESULTS.md):

    python bench/run_all.py [--quick] [--only NAME ...] [--out bench/RESULTS.md] [--timeout-s S] [--no-readme]

bench/curves.py's plot goes beside the table (bench/curves.png beside bench/RESULTS.md).

Each script runs as its own process, `python bench/NAME.py [--quick] --json FILE`, with a deadline (past
it: SIGINT, so that the script stops its servers, then SIGKILL to its process group); the rows it writes
(what, figure, floor, ratio, goal, command) go into the table as written, except that a row whose
physical floor it beat (ratio < 1 by more than the floor's own noise: bench_common.broken_floor) is
refused as a failure. A "met" column says, for each row with a goal, whether its ratio meets it, ties
with it within the row's measured noise, misses it for a reason the script measured in the same run
(the engine's own rate, SGLang's medium measured bare), or misses it (bench/goals.py); a line under the
table counts them. Above the table, one line names the machine, the commit, the date and the mode.
The VM's free page reporting is held off for the run where run_all may (bench/host_memory.py: the host's
faults on memory it took back fell on one side of a pair by chance); the machine line says which.
A script that fails or overruns its deadline gets a row saying so (its last stderr line); run_all then
exits 1, after writing the table with what the others measured. Progress and each script's log files
go to stderr.

A run of every script into the default --out also puts the table into README.md, between its two
RESULTS markers: the README's measured figures are always one run's, named by its header line
(tests/unit/test_bench_table.py holds the README to bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import NO_GOAL, NOISE, PHYSICAL, ROW_KEYS, at_least, broken_floor, command_line, row, run_bench
from goals import WHY, verdict
from host_memory import reporting_held_off
from lean_rl.cli import DEBUG_HELP, ArgumentParser

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
SCRIPTS = ("async_vs_sync", "capture_latency", "convert", "curves", "engine_start", "long_sequence_memory", "lora_sync",
           "multi_turn_overhead", "multinode", "rollout_throughput", "train_step", "trainer_heal", "weight_sync")
DEFAULT_TIMEOUT_S = {"quick": 900, "full": 3600}
TIMEOUT_FACTOR = {"curves": 2}  # five curves, each a small bench of its own
STOP_GRACE_S = 60  # after SIGINT, time to stop SGLang servers and Ray before SIGKILL
README = REPO / "README.md"
DEFAULT_OUT = BENCH / "RESULTS.md"
README_BEGIN = "<!-- RESULTS: bench/RESULTS.md as bench/run_all.py wrote it; rerun it, do not edit by hand -->"
README_END = "<!-- /RESULTS -->"
COLUMNS = (*ROW_KEYS[:5], "met", ROW_KEYS[5])  # "met": goals.verdict of the row


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """The header line of the table."""

    machine: str
    commit: str
    date: str
    mode: str
    seconds: float | None = None


# ------------------------------------------------------------------ the table (pure)
def render_table(rows: list[dict], info: RunInfo) -> str:
    took = "" if info.seconds is None else f", {info.seconds / 60:.1f} min in all"
    lines = [f"Machine: {info.machine}. Commit {info.commit}, {info.date}, mode: {info.mode}{took}.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r, key) for key in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n" + goals_summary(rows)


def goals_summary(rows: list[dict]) -> str:
    """One line under the table: how many rows with a goal meet it, tie with it, miss it for a measured
    reason, or miss it (goals.verdict)."""
    verdicts = [verdict(r, NOISE) for r in rows]
    counts = [sum(v == "yes" for v in verdicts), sum(v.startswith("tie") for v in verdicts),
              sum(v.startswith("no:") for v in verdicts), sum(v == "NO" for v in verdicts)]
    return (f"\nGoals: {counts[0]} met, {counts[1]} tied within their noise, {counts[2]} out of reach here "
            f"for the reason measured beside them, {counts[3]} missed.\n")


def cell(r: dict, key: str) -> str:
    value = verdict(r, NOISE) if key == "met" else r.get(key)
    if key == "ratio":
        text = NO_GOAL if value is None else f"{value:.3g}"
    elif key == "command":
        text = f"`{value}`"
    else:
        text = "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")  # one line; a '|' would end the cell


def failed_row(name: str, command: str, reason: str) -> dict:
    return row(f"bench/{name}.py", f"failed: {reason}", NO_GOAL, None, NO_GOAL, command)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no stderr)"


def _table_span(readme: str) -> tuple[int, int]:
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"README.md has no {README_BEGIN!r} ... {README_END!r} block for the table")
    return begin + len(README_BEGIN), end


def readme_table(readme: str) -> str:
    """The table between the README's RESULTS markers."""
    begin, end = _table_span(readme)
    return readme[begin:end].lstrip("\n")


def readme_with_table(readme: str, table: str) -> str:
    """`readme` with the text between its RESULTS markers replaced by `table`."""
    begin, end = _table_span(readme)
    return readme[:begin] + "\n" + table + readme[end:]


def commit_name(short_hash: str, dirty: bool) -> str:
    return short_hash + ("+dirty" if dirty else "")


# ------------------------------------------------------------------ the machine and the tree
def describe_machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo, meminfo = Path("/proc/cpuinfo"), Path("/proc/meminfo")
    if cpuinfo.is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    ram = "RAM unknown"
    if meminfo.is_file():
        kib = next((int(line.split()[1]) for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")), 0)
        ram = f"{kib / 2**20:.0f} GiB RAM"
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        found = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True)
        names = [line.strip() for line in found.stdout.splitlines() if line.strip()]
        if found.returncode == 0 and names:
            gpu = f"GPU {len(names)}x {names[0]}"
    return f"{cpu}, {os.cpu_count()} cores, {ram}, {gpu}"


def describe_commit(out: Path) -> str:
    """The short hash of HEAD, '+dirty' when the tree differs from it (the results file itself aside)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    excluded = []
    if out.resolve().is_relative_to(REPO):
        excluded = [f":(exclude){out.resolve().relative_to(REPO)}"]
    status = git("status", "--porcelain", "--", ".", *excluded)
    return commit_name(head.stdout.strip(), bool(status.stdout.strip()))


# ------------------------------------------------------------------ running one script
def _sigint_as_default() -> None:
    """In the script's process, before exec: SIGINT back to its default. A run_all started as a background
    job of a non-interactive shell (nohup ... &, a CI runner) has SIGINT ignored, and an ignored signal stays
    ignored across exec: stop()'s SIGINT would then do nothing and every deadline would cost STOP_GRACE_S
    more before the SIGKILL (measured: the deadline test 58 s instead of 1.4 s)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to the script's process group (it unwinds and stops its servers), SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def curves_png(out: Path) -> Path:
    """Where bench/curves.py's plot goes: beside the table."""
    return out.with_name("curves.png")


def shown_path(path: Path) -> str:
    """`path` relative to the repository when inside it (the scripts run there): the table's commands then
    read as a user at the repository root would type them."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_script(name: str, quick: bool, timeout_s: float, logs: Path, extra: tuple[str, ...] = ()
               ) -> tuple[list[dict], bool]:
    """(its rows, whether it succeeded). `extra`: flags of this script beyond --quick (not in its command)."""
    flags = ["--quick"] if quick else []
    command = command_line(name, flags)
    flags += extra
    json_path, out_path, err_path = (logs / f"{name}{suffix}" for suffix in (".json", ".out", ".err"))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), *flags, "--json", str(json_path)],
                                cwd=REPO, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True,  # its own group: the deadline stops all it started
                                preexec_fn=_sigint_as_default)
        try:
            status = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            stop(proc)
            return [failed_row(name, command, f"no result within --timeout-s {timeout_s:g}")], False
        except KeyboardInterrupt:
            stop(proc)
            raise
    if status != 0:
        return [failed_row(name, command, f"exit status {status}: {last_line(err_path.read_text())}")], False
    try:
        rows = json.loads(json_path.read_text())
    except (OSError, ValueError) as error:
        return [failed_row(name, command, f"no readable --json rows ({error})")], False
    if not rows or any(set(r) != {*ROW_KEYS, PHYSICAL, NOISE, WHY} for r in rows):
        return [failed_row(name, command, f"its --json rows lack the columns {', '.join(ROW_KEYS)}, {PHYSICAL}, "
                                          f"{NOISE}, {WHY}")], False
    broken = [reason for reason in map(broken_floor, rows) if reason]
    if broken:
        return [r for r in rows if not broken_floor(r)] + [failed_row(name, command, reason) for reason in broken], False
    return rows, True


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="bench/run_all.py", description=__doc__, epilog=DEBUG_HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="each script's --quick sizes (a few minutes each)")
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, metavar="NAME",
                        help=f"run only these scripts ({', '.join(SCRIPTS)})")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the table goes (besides stdout)")
    parser.add_argument("--no-readme", action="store_true", help="leave README.md as it is (by default a run "
                        "of every script into the default --out puts its table into README.md too)")
    parser.add_argument("--timeout-s", type=at_least(1), default=None,
                        help=f"deadline per script (default {DEFAULT_TIMEOUT_S['quick']} with --quick, else "
                             f"{DEFAULT_TIMEOUT_S['full']})")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    timeout_s = args.timeout_s or DEFAULT_TIMEOUT_S[mode]
    out = Path(args.out)
    commit = describe_commit(out)  # before anything is written
    logs = Path(tempfile.mkdtemp(prefix="lean_rl_bench_run_all_"))
    names = [name for name in SCRIPTS if not args.only or name in args.only]
    rows, failed = [], []
    started = time.monotonic()
    with reporting_held_off() as host:  # every script's rounds, not only the conversion's (host_memory.py)
        print(f"bench/run_all.py: {host}", file=sys.stderr, flush=True)
        for number, name in enumerate(names, 1):
            print(f"[{number}/{len(names)}] bench/{name}.py {'--quick ' if args.quick else ''}...", file=sys.stderr,
                  flush=True)
            began = time.monotonic()
            extra = ("--png", shown_path(curves_png(out))) if name == "curves" else ()
            script_rows, ok = run_script(name, args.quick, timeout_s * TIMEOUT_FACTOR.get(name, 1), logs, extra)
            rows += script_rows
            if not ok:
                failed.append(name)
            print(f"    {'ok' if ok else 'FAILED'} in {time.monotonic() - began:.0f} s; logs {logs / name}.out, .err",
                  file=sys.stderr, flush=True)
    info = RunInfo(f"{describe_machine()}; {host}", commit, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                   mode, time.monotonic() - started)
    table = render_table(rows, info)
    print(table, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    if not args.no_readme and not args.only and out.resolve() == DEFAULT_OUT.resolve():
        README.write_text(readme_with_table(README.read_text(), table))
        print(f"bench/run_all.py: the table is in {out} and in README.md", file=sys.stderr)
    if failed:
        print(f"bench/run_all.py: {len(failed)} of {len(names)} failed: {', '.join(failed)} (see the table and the "
              f"logs in {logs})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_bench("run_all", main)
