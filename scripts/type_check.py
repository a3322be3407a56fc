"""Static type check of lean_rl/ (mypy, configured in pyproject.toml) against a baseline that only shrinks.

    .venv/bin/python scripts/type_check.py           # exit 1 on a finding not in the baseline, or on a
                                                     # baseline entry that no longer occurs
    .venv/bin/python scripts/type_check.py --prune   # drop the baseline entries that no longer occur

Most CUDA branches never run on the CPU machines the tests run on; the checker reads them anyway, so a
wrong attribute, keyword or arity there fails here. tests/unit/test_type_check.py runs this.

The baseline (tests/unit/type_check_baseline.txt) holds the findings accepted when the check was
introduced, one per line as `file: [code] message`, without line numbers so that edits elsewhere in a
file do not churn it. It is never extended: fix a new finding, or silence one line with
`# type: ignore[code]` and a comment saying why. --prune only removes entries.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "unit" / "type_check_baseline.txt"
TIMEOUT_S = 600  # a cold run over lean_rl/ and the Megatron-core / SGLang code it calls takes ~1-2 min on 2 cores


def findings(files: list[str] | None = None) -> list[str]:
    """mypy's errors over pyproject's `files` (or `files`), as baseline lines; raises if mypy itself failed."""
    cmd = [sys.executable, "-m", "mypy", "--output", "json", *(files or [])]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    lines = []
    for line in run.stdout.splitlines():
        if not line.startswith("{"):
            continue
        item = json.loads(line)
        if item["severity"] == "error":
            lines.append(f"{Path(item['file']).as_posix()}: [{item['code']}] {item['message']}")
    if run.returncode not in (0, 1) or (run.returncode == 1 and not lines):  # 1 with findings, 2 on its own errors
        raise RuntimeError(f"mypy failed (exit status {run.returncode}): {run.stderr.strip() or run.stdout.strip()}")
    return sorted(lines)


def read_baseline() -> list[str]:
    return [line for line in BASELINE.read_text().splitlines() if line and not line.startswith("#")]


def write_baseline(entries: list[str]) -> None:
    header = ("# mypy findings on lean_rl/ accepted when the type check was introduced (issue 24); this file only\n"
              "# shrinks: scripts/type_check.py fails on a finding not listed here and on an entry that no longer\n"
              "# occurs (remove it with `python scripts/type_check.py --prune`).\n")
    BASELINE.write_text(header + "".join(f"{entry}\n" for entry in sorted(entries)))


def compare(current: list[str], baseline: list[str]) -> tuple[list[str], list[str]]:
    """(new findings, baseline entries that no longer occur), each a multiset difference."""
    now, accepted = collections.Counter(current), collections.Counter(baseline)
    return sorted((now - accepted).elements()), sorted((accepted - now).elements())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prune", action="store_true", help="remove baseline entries that no longer occur")
    args = parser.parse_args(argv)
    current, baseline = findings(), read_baseline()
    new, gone = compare(current, baseline)
    if args.prune:
        baseline = list((collections.Counter(baseline) - collections.Counter(gone)).elements())
        write_baseline(baseline)
        print(f"type_check: removed {len(gone)} entries; {len(baseline)} left in {BASELINE.relative_to(ROOT)}")
        gone = []
    for entry in new:
        print(f"new finding: {entry}")
    for entry in gone:
        print(f"fixed, remove from the baseline (--prune): {entry}")
    print(f"type_check: {len(current)} findings, {len(baseline)} in the baseline; {len(new)} new, "
          f"{len(gone)} baseline entries no longer occur")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
