"""Output directories that appear only when complete. (The HF side files that travel with the
weights, hf_side_files.copy_side_files, belong to the checkpoint format.)"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator


class OutputExistsError(FileExistsError):
    pass


@contextlib.contextmanager
def atomic_output_dir(final: str | Path) -> Iterator[Path]:
    """Yields an empty sibling temporary directory; on success it is renamed to `final`, on any error
    it is removed, so `final` never holds a partial result. `final` must not exist (or be empty)."""
    final = Path(final).absolute()
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise OutputExistsError(f"output {final} already exists and is not empty; remove it or choose another")
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        yield temporary
        if final.exists():
            final.rmdir()  # empty (checked above); os.replace onto a directory needs it gone
        os.replace(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
