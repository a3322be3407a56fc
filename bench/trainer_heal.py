"""A lost trainer rank: healed inside the run (lean_rl/trainer_heal.py) vs today's exit + rerun, in one run.

    .venv/bin/python bench/trainer_heal.py [--steps 5] [--call-timeout 30]

The same job (the tiny model on the toy task, 2 trainer ranks, --save-interval 1) three times, each with
one fault right after step 1: kill -9 of rank 1, healed; rank 1 stopped (SIGSTOP: a rank hung in a
collective) past --trainer-call-timeout, healed; kill -9 of rank 1 with --max-trainer-restarts 0, the run
exits and the same command is run again (a resume from the last checkpoint). Measured per fault: seconds
from the fault to the next step completed, and the steps redone. The ratio is exit + rerun / healed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

from bench_common import at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.options import ConfigError
from lean_rl.testing.tiny_model import make_tiny_model
from lean_rl.testing.toy_task import write_dataset
from lean_rl.testing.watched_run import WatchedRun

QUICK = {"steps": 5}
STEP_LINE = r"\nstep (\d+) \|"


def job_flags(work: Path, name: str, model: Path, data: Path, args, *extra: str) -> list[str]:
    return ["--hf-checkpoint", str(model), "--output-dir", str(work / name / "run"), "--no-tensorboard",
            "--prompt-data", str(data), "--rollout-shuffle", "--num-rollout", str(args.steps),
            "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
            "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "12",
            "--lr", "1e-3", "--micro-batch-size", "8", "--rollout-num-engines", "1",
            "--actor-num-procs-per-node", "2", "--save", str(work / name / "ckpt"), "--load", str(work / name / "ckpt"),
            "--save-interval", "1", "--trainer-call-timeout", str(args.call_timeout), *extra]


def fault_then_next_step(run: WatchedRun, signum: int) -> tuple[float, int, int, int]:
    """After step 1 is logged, `signum` to rank 1; returns (the fault's time, the last step logged before
    it, where in the log it came, rank 1's pid)."""
    pids = run.rank_pids()
    found = run.wait_for(r"\nstep 1 \|", 600)  # then at once: steps take a second or two
    before = max(int(s) for s in re.findall(STEP_LINE, run.text()))
    position = len(run.text())
    os.kill(pids[1], signum)
    return time.monotonic(), before, max(position, found.end()), pids[1]


def healed(work: Path, model: Path, data: Path, args, name: str, signum: int) -> dict:
    with WatchedRun("lean_rl.train", job_flags(work, name, model, data, args), work / f"{name}.log") as run:
        faulted, _, position, rank_1 = fault_then_next_step(run, signum)
        step = int(run.wait_for(STEP_LINE, 900, after=position).group(1))
        seconds = time.monotonic() - faulted
        if run.wait(900) != 0:
            raise RuntimeError(f"{name}: the healed run failed:\n{run.text()[-3000:]}")
    if signum == signal.SIGSTOP:
        try:
            os.kill(rank_1, signal.SIGKILL)  # the heal killed it; never leave one stopped
        except ProcessLookupError:
            pass
    rows = [json.loads(line) for line in (work / name / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"seconds": seconds, "redone": int(next(r["fault/steps_redone"] for r in rows if "fault/steps_redone" in r))}


def exit_and_rerun(work: Path, model: Path, data: Path, args) -> dict:
    flags = job_flags(work, "rerun", model, data, args, "--max-trainer-restarts", "0")
    with WatchedRun("lean_rl.train", flags, work / "exit.log") as run:
        faulted, before, _, _ = fault_then_next_step(run, signal.SIGKILL)
        if run.wait(900) == 0:
            raise RuntimeError("the run without healing did not exit after losing a rank")
    with WatchedRun("lean_rl.train", flags, work / "rerun.log") as run:
        step = int(run.wait_for(STEP_LINE, 900).group(1))
        seconds = time.monotonic() - faulted
        if run.wait(900) != 0:
            raise RuntimeError(f"the rerun failed:\n{run.text()[-3000:]}")
    return {"seconds": seconds, "redone": max(before + 1 - step, 0)}


def main(argv: list[str]) -> int:
    parser = bench_parser("trainer_heal", __doc__, QUICK)
    parser.add_argument("--steps", type=at_least(5), default=6, help="steps of each run (the fault right after step 1)")
    parser.add_argument("--call-timeout", type=at_least(10), default=30,
                        help="--trainer-call-timeout: how long the hung rank is waited for")
    parser.add_argument("--work-dir", help="where the runs write (default: a temporary directory)")
    args = parse_bench_args(parser, argv)
    if args.work_dir and Path(args.work_dir).exists() and not Path(args.work_dir).is_dir():
        raise ConfigError(f"--work-dir {args.work_dir}: exists and is not a directory")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lean_rl_bench_heal_"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(work / "model")
    data = write_dataset(work / "train.jsonl", 256, seed=0)
    kill = healed(work, model, data, args, "kill", signal.SIGKILL)
    hang = healed(work, model, data, args, "hang", signal.SIGSTOP)
    rerun = exit_and_rerun(work, model, data, args)
    print(f"\nfault -> next completed step (tiny model, 2 trainer ranks, --save-interval 1, fault right after step 1):")
    for name, r in (("kill -9, healed", kill), (f"hang past {args.call_timeout} s, healed", hang),
                    ("kill -9, exit + rerun", rerun)):
        print(f"  {name:28s} {r['seconds']:7.1f} s   steps redone {r['redone']}")
    command = command_line("trainer_heal", argv)
    rows = [
        row("kill -9 of a trainer rank: fault → next completed step, healed in the run (engines kept) vs exit + "
            "rerun (tiny model, 2 ranks, --save-interval 1)",
            f"{kill['seconds']:.1f} s, {kill['redone']} step(s) redone",
            f"{rerun['seconds']:.1f} s exit + rerun, {rerun['redone']} redone", rerun["seconds"] / kill["seconds"],
            "> 1", command),
        row(f"a trainer rank hung past --trainer-call-timeout {args.call_timeout}: fault → next completed step, "
            "healed in the run", f"{hang['seconds']:.1f} s, {hang['redone']} step(s) redone",
            f"{args.call_timeout} s call timeout", hang["seconds"] / args.call_timeout, "—", command),
    ]
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("trainer_heal", main)
