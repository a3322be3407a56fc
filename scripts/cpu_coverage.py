"""The lines of lean_rl/ that no CPU test executes: the test suite under coverage, every process measured.

    .venv/bin/python scripts/cpu_coverage.py                  # the default suite (as .ci/run runs it)
    .venv/bin/python scripts/cpu_coverage.py tests/unit -x    # any pytest arguments instead

Every Python process the tests start is measured, not only pytest's: coverage's .pth hook starts it in
each process that has COVERAGE_PROCESS_START (the train.py subprocesses, the Ray actors, the SGLang
servers' launcher); Ray actors save their data before they are killed (lean_rl/utils/coverage_data.py).
Configuration: [tool.coverage.*] in pyproject.toml. Writes .cache/coverage/never_run_on_cpu.txt (each
file's unexecuted line ranges) and prints the totals and the files with most unexecuted lines.
These are mostly the GPU paths (CUDA, NCCL, colocated IPC); the static type check
(scripts/type_check.py) is what reads them on CPU.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".cache" / "coverage"
DEFAULT_ARGS = ["--timeout=900", "-q", "-p", "no:cacheprovider"]  # pyproject's addopts deselect -m slow


def main(argv: list[str]) -> int:
    import coverage

    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    env = {**os.environ, "COVERAGE_PROCESS_START": str(ROOT / "pyproject.toml"),
           "COVERAGE_FILE": str(OUT / "data"), "OMP_NUM_THREADS": "1"}
    print(f"cpu_coverage: running pytest {' '.join(argv or DEFAULT_ARGS)} with every process measured", flush=True)
    tests = subprocess.run([sys.executable, "-m", "pytest", *(argv or DEFAULT_ARGS)], cwd=ROOT, env=env)

    cov = coverage.Coverage(config_file=str(ROOT / "pyproject.toml"), data_file=str(OUT / "data"))
    cov.combine(data_paths=[str(OUT)], keep=False)
    cov.save()
    listing = io.StringIO()
    percent = cov.report(file=listing, show_missing=True)
    (OUT / "never_run_on_cpu.txt").write_text(listing.getvalue())
    statements = missed = 0
    per_file = []
    for path in sorted(cov.get_data().measured_files() | _unimported(cov)):
        _, lines, _, missing, _ = cov.analysis2(path)
        statements += len(lines)
        missed += len(missing)
        if missing:
            per_file.append((len(missing), os.path.relpath(path, ROOT)))
    print(f"cpu_coverage: pytest exit status {tests.returncode}")
    print(f"cpu_coverage: {statements} statements in lean_rl/, {missed} never executed on CPU "
          f"({100 - percent:.1f}%); per file: {OUT / 'never_run_on_cpu.txt'}")
    for count, path in sorted(per_file, reverse=True)[:20]:
        print(f"  {count:5d}  {path}")
    return tests.returncode


def _unimported(cov) -> set[str]:
    """Files of lean_rl/ that no process imported (coverage's report counts them too, all missed)."""
    measured = cov.get_data().measured_files()
    return {str(p) for p in (ROOT / "lean_rl").rglob("*.py") if str(p) not in measured}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
