"""Coverage data from Ray actors, for scripts/cpu_coverage.py (the lines of lean_rl/ that no CPU test runs).

That script measures every Python process it starts through COVERAGE_PROCESS_START (coverage's .pth
hook). A process that exits or gets SIGTERM writes its data itself; a Ray actor does not: ray.kill ends
it with SIGKILL, which skips coverage's save at exit. The shutdown paths call this first."""

from __future__ import annotations

import os


def save_coverage_data() -> None:
    """Write this process's coverage data now, when it is being measured; otherwise do nothing."""
    if not os.environ.get("COVERAGE_PROCESS_START"):
        return
    try:
        import coverage
    except ImportError:
        return
    current = coverage.Coverage.current()
    if current is not None:
        current.save()


def measured() -> bool:
    """Whether this run is under scripts/cpu_coverage.py (its actors should save before they are killed)."""
    return bool(os.environ.get("COVERAGE_PROCESS_START"))
