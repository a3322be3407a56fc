"""The torch_dist checkpoint format, owned here and only here: where checkpoints live on disk
(Megatron-LM's layout, so tools that know it find their way), what an iteration directory holds,
and the one resolver (`find_checkpoint`) that the trainer, MegatronGroup's pre-checks and the
converters (lean_rl.convert, which imports this module; never the reverse) all use.

    ROOT/latest_checkpointed_iteration.txt     "N" (the step of the newest complete checkpoint)
    ROOT/iter_000000N/                         one torch_dist checkpoint (dist_checkpointing.save)
    ROOT/iter_000000N/.metadata                its torch.distributed.checkpoint metadata
    ROOT/iter_000000N/hf_config/               optional: the HF side files (config.json, tokenizer,
                                               ...) of the model, so converters need no --hf-config
    ROOT/iter_000000N.tmp/                     being written; renamed to iter_000000N when complete
    ROOT/iter_000000N.old/                     only while step N is re-saved: the complete checkpoint
                                               it replaces, moved aside (deleted once the new one is in)
    ROOT/iter_000000N.del/                     being deleted (a replaced or pruned checkpoint)

A checkpoint is complete only once its directory carries the final name AND the tracker names it.
`publish_phases` is the protocol, one durable step at a time (every file and directory of the new
checkpoint fsynced before any rename, every rename followed by an fsync of ROOT):
  1. fsync iter_N.tmp/ (all its files and directories, itself);
  2. re-saving step N: rename the published iter_N to iter_N.old (nothing is deleted yet);
  3. rename iter_N.tmp to iter_N;
  4. rewrite the tracker through a temporary file (written, fsynced, renamed over it);
  5. re-saving: rename iter_N.old to iter_N.del, then delete it.
A kill -9 at any point leaves a loadable checkpoint for the tracker: either the old one or the new
one. The only state in which the tracker's iter_N is missing is between 2 and 3; there its complete
predecessor is iter_N.old, and the resolver (`latest_step`, `find_checkpoint`) reads it from there.
`remove_stale_temporaries` (run before every save, by `prepare_temporary_dir`) repairs what a crash
left: iter_N.old goes back to iter_N if that is missing (else it is deleted), and iter_N.tmp,
iter_N.del and tracker temporaries are deleted; nothing else under ROOT is touched. `prune` (for
--keep-last-checkpoints) deletes old iterations through the same rename-to-.del first, so a crash
mid-delete never leaves a half-deleted directory under a final name.

Pure stdlib: importing it imports neither torch nor Megatron.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's metadata file, in every torch_dist directory
HF_CONFIG_DIR = "hf_config"  # inside an iteration directory: the HF config + tokenizer it came from
_ITER_RE = re.compile(r"^iter_(\d{7})$")
TMP_SUFFIX, ASIDE_SUFFIX, TRASH_SUFFIX = ".tmp", ".old", ".del"
# What this module's protocol leaves behind after a crash, and nothing else: the only names
# remove_stale_temporaries touches.
_LEFTOVER_RE = re.compile(r"^iter_(\d{7})\.(tmp|old|del)$")
_TRACKER_TMP_RE = re.compile(r"^\." + re.escape(TRACKER) + r"\.tmp-\d+$")


class CheckpointError(ValueError):
    """A checkpoint on disk is missing, truncated or inconsistent; the message names the file."""


def iteration_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def temporary_dir(root: str | Path, step: int) -> Path:
    """Where step `step` is written before it is published; the same name on every rank."""
    return Path(root) / f"iter_{step:07d}{TMP_SUFFIX}"


def aside_dir(root: str | Path, step: int) -> Path:
    """Where the published checkpoint of `step` waits while `step` is re-saved (complete)."""
    return Path(root) / f"iter_{step:07d}{ASIDE_SUFFIX}"


def trash_dir(root: str | Path, step: int) -> Path:
    """Where a checkpoint of `step` is renamed before it is deleted."""
    return Path(root) / f"iter_{step:07d}{TRASH_SUFFIX}"


# -- durability -------------------------------------------------------------------------------------

def fsync_dir(path: str | Path) -> None:
    """fsync a directory (its entries: names created, renamed or removed in it). Filesystems that
    cannot fsync a directory (EINVAL / ENOTSUP, e.g. some FUSE mounts) are let be."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file and directory under `path`, and `path` itself (files before the directory
    that holds them). Files other ranks wrote are included: fsync acts on the file, not the writer."""
    for directory, _, files in os.walk(path, topdown=False):
        for name in files:
            file = os.path.join(directory, name)
            if not os.path.islink(file):
                fsync_file(file)
        fsync_dir(directory)


def _rename(source: Path, dest: Path) -> None:
    """Rename within ROOT and make it durable (fsync of the directory holding both names)."""
    os.rename(source, dest)
    fsync_dir(dest.parent)


def write_tracker(root: str | Path, step: int) -> None:
    """Point the tracker at `step` atomically: a temporary file, written and fsynced, renamed over it,
    and the rename made durable. A crash leaves the old tracker or the new one, never a torn one."""
    root = Path(root)
    tracker_tmp = root / f".{TRACKER}.tmp-{os.getpid()}"
    with open(tracker_tmp, "w") as f:
        f.write(f"{step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tracker_tmp, root / TRACKER)
    fsync_dir(root)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def discard(root: str | Path, path: Path, step: int) -> None:
    """Delete a checkpoint directory of `step` (published, or moved aside) without ever leaving it
    half-deleted under its name: renamed to iter_N.del first (durably), then deleted."""
    trash = trash_dir(root, step)
    _remove(trash)  # a leftover of an earlier crash: garbage
    _rename(path, trash)
    _remove(trash)


# -- the save protocol ------------------------------------------------------------------------------

def prepare_temporary_dir(root: str | Path, step: int) -> Path:
    """Create temporary_dir empty (dist_checkpointing needs it to exist), after repairing what an
    earlier crash left under `root` (remove_stale_temporaries). Call on one rank, then barrier."""
    Path(root).mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(root)
    path = temporary_dir(root, step)
    _remove(path)
    path.mkdir()
    return path


def publish_phases(root: str | Path, step: int, written: Path) -> Iterator[str]:
    """The publishing protocol (module docstring), one durable step per item: each yields the name of
    the step just completed. `publish` runs them all; a test stops after any of them to leave the
    filesystem exactly as a kill -9 at that point would (nothing here runs on abandonment)."""
    root = Path(root)
    final, aside = iteration_dir(root, step), aside_dir(root, step)
    fsync_tree(written)
    yield "synced"
    replacing = os.path.lexists(final)
    if replacing:  # re-saving the same step (e.g. after a resume): move the old one aside, whole
        if os.path.lexists(aside):  # cannot be the only copy: `final` exists
            discard(root, aside, step)
        _rename(final, aside)
        yield "moved_aside"
    _rename(Path(written), final)
    yield "renamed"
    write_tracker(root, step)
    yield "tracked"
    if replacing:
        discard(root, aside, step)
        yield "old_deleted"


def publish(root: str | Path, step: int, written: Path) -> Path:
    """Make the checkpoint in `written` (temporary_dir) the complete checkpoint of `step` and the
    tracker's. One rank, after every rank finished writing."""
    for _ in publish_phases(root, step, written):
        pass
    return iteration_dir(root, step)


def prune(root: str | Path, keep_last: int) -> list[int]:
    """--keep-last-checkpoints: delete every published iteration but the newest `keep_last` (by
    step) and the tracker's (always kept, even when older). Returns the steps deleted. One rank,
    after a successful publish."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    steps = list_steps(root)
    keep = set(steps[-keep_last:])
    latest = latest_step(root)
    if latest is not None:
        keep.add(latest)
    removed = [step for step in steps if step not in keep]
    for step in removed:
        discard(root, iteration_dir(root, step), step)
    if removed:
        logger.info("%s: deleted checkpoints of steps %s (--keep-last-checkpoints %d)", root, removed, keep_last)
    return removed


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Repair what a crash mid-save (or mid-delete) left under `root`, touching only the names this
    module's protocol makes: iter_N.old goes back to iter_N when that is missing (it is the complete
    checkpoint a crash mid re-save moved aside) and is deleted otherwise; iter_N.tmp (unpublished),
    iter_N.del (being deleted) and tracker temporaries are deleted. Returns what was deleted."""
    root = Path(root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for path in sorted(root.iterdir()):
        match = _LEFTOVER_RE.match(path.name)
        if match and match.group(2) == ASIDE_SUFFIX[1:]:
            step = int(match.group(1))
            if not os.path.lexists(iteration_dir(root, step)):
                _rename(path, iteration_dir(root, step))
                logger.warning("%s: restored from %s (a save of that step was interrupted)",
                               iteration_dir(root, step), path.name)
                continue
            discard(root, path, step)
            removed.append(path)
        elif match or _TRACKER_TMP_RE.match(path.name):
            _remove(path)
            removed.append(path)
    if removed:
        fsync_dir(root)
        logger.info("%s: removed leftovers of an interrupted save: %s", root, ", ".join(p.name for p in removed))
    return removed


def _published_dir(root: str | Path, step: int) -> Path | None:
    """The directory holding the published checkpoint of `step`: iter_N, or iter_N.old while a
    re-save of step N is between moving the old one aside and renaming the new one in."""
    for directory in (iteration_dir(root, step), aside_dir(root, step)):
        if directory.is_dir():
            return directory
    return None


def has_step(root: str | Path, step: int) -> bool:
    """Whether `root` holds a published checkpoint of `step` (as find_checkpoint(root, step) resolves)."""
    return _published_dir(root, step) is not None


def latest_step(root: str | Path) -> int | None:
    """The step the tracker names, or None when ROOT holds no complete checkpoint."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker}: expected an iteration number, found {text!r}")
    step = int(text)
    if not has_step(root, step):
        raise FileNotFoundError(f"{tracker} names step {step} but {iteration_dir(root, step)} is missing")
    return step


def list_steps(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _ITER_RE.match(p.name)) and p.is_dir())


def find_checkpoint(path: str | Path, step: int | None = None) -> tuple[int | None, Path]:
    """The one resolver: (step, directory) of the torch_dist checkpoint `path` names. `path` is
    - a checkpoint root: its latest complete checkpoint (the tracker's), or that of `step` when given;
    - or one torch_dist directory (holding .metadata, e.g. ROOT/iter_000000N): itself, its step read
      from an iter_N name (else None).
    Raises CheckpointError naming what is missing (before any rank reads anything)."""
    path = Path(path)
    if step is not None:
        directory = _published_dir(path, step)
        if directory is None:
            raise CheckpointError(f"{path} has no iteration {step} ({iteration_dir(path, step)} is missing)")
        return step, directory
    if (path / DCP_METADATA).is_file():
        match = _ITER_RE.match(path.name)
        return (int(match.group(1)) if match else None), path
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory")
    step = latest_step(path)
    if step is None:
        raise CheckpointError(f"{path}: neither a torch_dist checkpoint ({DCP_METADATA}) nor a checkpoint root with "
                              f"{TRACKER} (half-written iter_*.tmp directories do not count)")
    return step, _published_dir(path, step)
