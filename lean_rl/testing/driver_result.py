"""A test's driver script (`python -c CODE`) hands its result back in a JSON file, never on stdout: Ray, SGLang
and the interpreter's exit may print to the same stream after the driver's last line (Ray's "A worker died
or was killed ..." paragraph at shutdown is one), so a test that parsed stdout's last line broke on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT_ENV = "LEAN_RL_DRIVER_RESULT"  # where write_result puts the driver's result


def write_result(result: object) -> None:
    """In the driver: its result, as JSON, into the file run_driver named."""
    Path(os.environ[RESULT_ENV]).write_text(json.dumps(result))


def run_driver(code: str, *args: str, timeout_s: float, env: dict[str, str] | None = None
               ) -> tuple[subprocess.CompletedProcess, object]:
    """Run `python -c code *args`; returns the finished process and what it passed to write_result (None when
    it wrote nothing, e.g. it failed first: the caller asserts on the process, whose output it holds)."""
    with tempfile.TemporaryDirectory(prefix="lean_rl_driver_") as tmp:
        path = Path(tmp) / "result.json"
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {}), RESULT_ENV: str(path)})
        result = json.loads(path.read_text()) if path.exists() else None
    return done, result
