"""A lean_rl command run as a user runs it, in a subprocess whose output goes to a log file that the
caller watches line by line: to inject a fault at a known point (kill -9 of a trainer rank, SIGSTOP,
a node removed) and to time what follows (tests/e2e/test_trainer_heal.py, bench/trainer_heal.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# what the run logs once its trainer ranks started (backends/megatron/group.py)
RANK_PIDS = r"trainer ranks on nodes \[[^]]*\], pids \[([0-9, ]+)\]"


class WatchedRun:
    def __init__(self, module: str, flags: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", module, *flags], cwd=REPO, env=env, stdout=out,
                                            stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float, after: int = 0) -> re.Match:
        """The first match of `pattern` in the log from character `after` on; AssertionError (with the
        log's tail) when the run ends first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.compile(pattern).search(self.text(), after)
            if found:
                return found
            assert self.process.poll() is None, f"the run ended before /{pattern}/:\n" + self.text()[-4000:]
            assert time.monotonic() < deadline, f"no /{pattern}/ within {timeout_s:.0f} s:\n" + self.text()[-4000:]
            time.sleep(0.2)

    def rank_pids(self, timeout_s: float = 240) -> list[int]:
        """The latest trainer ranks' pids (rank order), once logged."""
        self.wait_for(RANK_PIDS, timeout_s)
        return [int(p) for p in re.findall(RANK_PIDS, self.text())[-1].split(",")]

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout_s)

    def __enter__(self) -> WatchedRun:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:  # the run we started, by its pid: its Ray and servers go with it
            self.process.kill()
            self.process.wait(30)
