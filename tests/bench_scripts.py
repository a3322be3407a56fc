"""bench/ scripts imported by the unit tests as the scripts import each other: with bench/ on sys.path
for the import only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def import_bench(name: str) -> ModuleType:
    """bench/NAME.py as a module (its own `import bench_common` resolved from bench/)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
