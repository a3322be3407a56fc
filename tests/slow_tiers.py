"""The slow tests (`-m slow`, which CI does not run) in groups by cost, so that a change runs the group it
touches. Every slow test is in exactly one group (tests/unit/test_slow_tiers.py holds that):

    bash scripts/test.sh --slow-tiers                  # every group, one after the other
    bash scripts/test.sh --slow-tiers integration e2e  # the groups named; pytest arguments after `--`

Each group prints its pass count and minutes when it ends, and the table of all groups at the end; the
counts come from the JUnit XML file the group's pytest writes (.cache/slow_tiers/GROUP.xml), not its output.
Minutes on 2 unshared cores (issue 46, clean clone): integration ~11, e2e ~25; examples ~60 (its tests'
own estimates). On 2 cores shared with other jobs (load 15-35) integration took 65 min."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# group -> (what it holds, the test files or folders in it); a slow test's file is in exactly one group
TIERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "integration": ("the parallel layouts (TP2xPP2, MoE EP2), checkpoint conversion, engines and weight sync",
                    ("tests/integration/",)),
    "e2e": ("the fault and resume paths (trainer heal, node loss, engine kill, kill -9 / SIGTERM rerun) and the "
            "loop variants (async, multi-node, PPO, bf16, routing replay, slime, the new model families)",
            ("tests/e2e/test_debug_modes.py", "tests/e2e/test_engine_faults.py", "tests/e2e/test_mixed_precision.py",
             "tests/e2e/test_multinode.py", "tests/e2e/test_multinode_failure.py", "tests/e2e/test_ppo.py",
             "tests/e2e/test_resume.py", "tests/e2e/test_routing_replay_run.py", "tests/e2e/test_vlm_run.py",
             "tests/e2e/test_save_on_a_full_disk.py", "tests/e2e/test_save_hf_run.py",
             "tests/e2e/test_slime_compat_run.py",
             "tests/e2e/test_slime_launch.py", "tests/e2e/test_train_loops.py", "tests/e2e/test_trainer_heal.py",
             "tests/e2e/test_model_families_run.py", "tests/unit/test_slime_launch_plan.py",
             "tests/e2e/test_preference_runs.py", "tests/e2e/test_reward_routing_run.py",
             "tests/e2e/test_evaluate_checkpoint.py",
             "tests/e2e/test_tinker_server.py",
             "tests/e2e/test_python_api_run.py")),
    "examples": ("the examples that learn (tool calling, search, agents, math on a real model, distillation) and "
                 "slime's own examples run unchanged",
                 ("tests/e2e/test_agent_examples_learn.py", "tests/e2e/test_distillation_example.py",
                  "tests/e2e/test_example_fully_async.py", "tests/e2e/test_example_math_real_model.py",
                  "tests/e2e/test_example_openai_agent.py", "tests/e2e/test_examples.py",
                  "tests/e2e/test_verifiers_env.py", "tests/e2e/test_slime_examples.py",
                  "tests/e2e/test_slime_agent_examples.py", "tests/e2e/test_reward_model_pipeline.py")),
}


def tiers_of(nodeid: str) -> list[str]:
    """The groups whose files hold the test `nodeid` (tests/e2e/test_resume.py::test_x[param])."""
    path = nodeid.split("::")[0]
    return [name for name, (_, paths) in TIERS.items()
            if any(path == p or (p.endswith("/") and path.startswith(p)) for p in paths)]


def parse_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """[GROUP...] [-- PYTEST-ARGS...] -> (groups, pytest args); no group: all of them, in TIERS order."""
    groups, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    for name in groups:
        if name not in TIERS:
            raise SystemExit(f"slow_tiers: unknown group {name!r}; the groups: {', '.join(TIERS)}")
    return groups or list(TIERS), extra


def junit_counts(xml_path: Path) -> dict[str, int]:
    """passed / failed / errors / skipped from a pytest JUnit XML file."""
    suite = ET.parse(xml_path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"]}


def summary(name: str, counts: dict[str, int] | None, minutes: float) -> str:
    if counts is None:
        return f"slow tier {name}: no result file (pytest did not run to its end) after {minutes:.1f} min"
    said = ", ".join(f"{n} {key}" for key, n in counts.items() if n or key == "passed")
    return f"slow tier {name}: {said} in {minutes:.1f} min"


def run_tier(name: str, extra: list[str]) -> tuple[str, bool]:
    xml_path = REPO / ".cache" / "slow_tiers" / f"{name}.xml"
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    xml_path.unlink(missing_ok=True)
    print(f"\n=== slow tier {name}: {TIERS[name][0]}", flush=True)
    started = time.monotonic()
    pytest = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "slow", "--timeout=900", "--durations=10",
                               f"--junitxml={xml_path}", *TIERS[name][1], *extra],
                              cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    try:
        code = pytest.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached pytest too (one process group): let it stop its test and write its JUnit file,
        # as subprocess.call would not (it SIGKILLs the child on any exception, the file unwritten)
        code = wait_after_interrupt(pytest, INTERRUPT_GRACE_S)
        interrupted = True
    else:
        interrupted = False
    counts = junit_counts(xml_path) if xml_path.exists() else None
    line = summary(name, counts, (time.monotonic() - started) / 60) + (" (stopped by Ctrl-C)" if interrupted else "")
    print(line, flush=True)
    if interrupted:
        raise KeyboardInterrupt(line)
    return line, code == 0


INTERRUPT_GRACE_S = 300  # a stopped test's teardown (servers, Ray) and the JUnit file


def wait_after_interrupt(proc: subprocess.Popen, grace_s: float) -> int:
    """The exit code of `proc`, given `grace_s` to end after Ctrl-C (another Ctrl-C starts the wait
    again: pytest ends harder on its second), then killed."""
    try:
        return proc.wait(grace_s)
    except KeyboardInterrupt:
        return wait_after_interrupt(proc, grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def main(argv: list[str]) -> int:
    groups, extra = parse_args(argv)
    results: list[tuple[str, bool]] = []
    try:
        for name in groups:
            results.append(run_tier(name, extra))
    except KeyboardInterrupt as stopped:  # the groups run so far, and the one stopped with its counts
        results.append((str(stopped), False))
        print("\n" + "\n".join(line for line, _ in results))
        return 130
    print("\n" + "\n".join(line for line, _ in results))
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
