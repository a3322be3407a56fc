"""Where checkpoints live on disk: Megatron-LM's layout, so tools that know it find their way.

    ROOT/latest_checkpointed_iteration.txt     "N" (the step of the newest complete checkpoint)
    ROOT/iter_000000N/                         one torch_dist checkpoint (dist_checkpointing.save)
    ROOT/iter_000000N.tmp/                     being written; renamed to iter_000000N when complete

A checkpoint is complete only once its directory carries the final name AND the tracker names it:
writing goes to a temporary directory, which is renamed, and only then the tracker is rewritten
(itself through a temporary file and an atomic rename). A crash at any point leaves either the old
checkpoint as `latest` or the new one, never a half-written directory under a final name.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
_ITER_RE = re.compile(r"^iter_(\d{7})$")


def iteration_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def temporary_dir(root: str | Path, step: int) -> Path:
    """Where step `step` is written before it is published; the same name on every rank."""
    return Path(root) / f"iter_{step:07d}.tmp"


def prepare_temporary_dir(root: str | Path, step: int) -> Path:
    """Create temporary_dir empty (dist_checkpointing needs it to exist). Call on one rank, then barrier."""
    path = temporary_dir(root, step)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def publish(root: str | Path, step: int, written: Path) -> Path:
    """Make the checkpoint in `written` (temporary_dir) the complete checkpoint of `step`. One rank,
    after every rank finished writing."""
    final = iteration_dir(root, step)
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.replace(written, final)
    tracker_tmp = Path(root) / f".{TRACKER}.tmp-{os.getpid()}"
    tracker_tmp.write_text(f"{step}\n")
    os.replace(tracker_tmp, Path(root) / TRACKER)
    return final


def latest_step(root: str | Path) -> int | None:
    """The step the tracker names, or None when ROOT holds no complete checkpoint."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker}: expected an iteration number, found {text!r}")
    step = int(text)
    if not iteration_dir(root, step).is_dir():
        raise FileNotFoundError(f"{tracker} names step {step} but {iteration_dir(root, step)} is missing")
    return step


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Delete directories a crashed save left behind; returns what was removed."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for path in root.glob("iter_*.tmp"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def list_steps(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _ITER_RE.match(p.name)) and p.is_dir())


def find_checkpoint(root: str | Path, step: int | None = None) -> tuple[int, Path]:
    """(step, directory) of the latest complete checkpoint under ROOT, or of `step` when given."""
    if step is not None:
        directory = iteration_dir(root, step)
        if not directory.is_dir():
            raise FileNotFoundError(f"{root} has no complete checkpoint of step {step} ({directory} is missing)")
        return step, directory
    step = latest_step(root)
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint under {root} "
                                f"(no {TRACKER}; half-written iter_*.tmp directories are ignored)")
    return step, iteration_dir(root, step)
