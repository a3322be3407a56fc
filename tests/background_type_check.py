"""scripts/type_check.py (mypy, ~1.5 min on one core with a cold cache) as a process started when the
session knows it will run tests/unit/test_type_check.py (tests/conftest.py), so that it runs beside the
e2e and integration tests, which mostly wait on their servers; the test collects its result."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "type_check.py"
_running: tuple[subprocess.Popen, tempfile._TemporaryFileWrapper] | None = None


def start() -> None:
    global _running
    if _running is None:
        out = tempfile.NamedTemporaryFile("w+", prefix="lean_rl_type_check_", suffix=".log")
        _running = subprocess.Popen([sys.executable, str(SCRIPT)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    text=True), out


def result(timeout_s: float) -> tuple[int, str]:
    """(exit status, output) of the run start() began (started now if it was not)."""
    start()
    assert _running is not None
    process, out = _running
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop()
        raise
    out.seek(0)
    return process.returncode, out.read()


def stop() -> None:
    """At the session's end: a run nobody collected (the session stopped early) is ended, by its pid."""
    global _running
    if _running is not None:
        process, out = _running
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
        _running = None
