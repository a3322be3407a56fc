"""Wall time of one sandboxed tool call (lean_rl.rollout.sandbox.run_python of `pass` under bwrap, with its
cgroup where one is in force), one call at a time; optionally side by side with another checkout of lean_rl.

    .venv/bin/python bench/sandbox_call.py [--calls 20] [--rounds 3] [--compare-to /path/to/other/checkout]

Each round runs --calls calls in a fresh process per tree (PYTHONPATH selects the tree), the trees
alternating so that drift of a shared machine hits both; figures are medians and p90 over all calls,
the first call of each process (it proves bwrap and the cgroup) left out. Not part of bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CALLS = """import asyncio, json, sys, time
from lean_rl.rollout import sandbox
async def main(n):
    seconds = []
    for _ in range(n + 1):
        start = time.perf_counter()
        result = await sandbox.run_python('pass')
        assert result.status == 'ok', result
        seconds.append(time.perf_counter() - start)
    return seconds[1:]
print(json.dumps({'file': sandbox.__file__, 'seconds': asyncio.run(main(int(sys.argv[1])))}))
"""


def one_round(tree: Path, calls: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CALLS, str(calls)], env=env, capture_output=True, text=True,
                          timeout=600, check=True)
    found = json.loads(done.stdout)
    assert found["file"].startswith(str(tree)), (found["file"], tree)  # that tree's lean_rl was measured
    return found["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/sandbox_call.py", description=__doc__)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare-to", type=Path, help="another checkout of lean_rl, measured alternately")
    args = parser.parse_args()
    trees = [HERE] + ([args.compare_to.resolve()] if args.compare_to else [])
    seconds: dict[Path, list[float]] = {tree: [] for tree in trees}
    for _ in range(args.rounds):
        for tree in trees:
            seconds[tree] += one_round(tree, args.calls)
    for tree, found in seconds.items():
        found.sort()
        print(f"{tree}: {len(found)} calls, median {statistics.median(found) * 1000:.0f} ms, "
              f"p90 {found[int(0.9 * (len(found) - 1))] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
