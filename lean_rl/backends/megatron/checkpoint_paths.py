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

A checkpoint is complete only once its directory carries the final name AND the tracker names it:
writing goes to a temporary directory, which is renamed, and only then the tracker is rewritten
(itself through a temporary file and an atomic rename). A crash at any point leaves either the old
checkpoint as `latest` or the new one, never a half-written directory under a final name.

Pure stdlib: importing it imports neither torch nor Megatron.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's metadata file, in every torch_dist directory
HF_CONFIG_DIR = "hf_config"  # inside an iteration directory: the HF config + tokenizer it came from
_ITER_RE = re.compile(r"^iter_(\d{7})$")
# Weight files and indexes are never copied as HF "side files": the converters write their own.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".distcp")
_WEIGHT_INDEXES = (".safetensors.index.json", ".bin.index.json")


class CheckpointError(ValueError):
    """A checkpoint on disk is missing, truncated or inconsistent; the message names the file."""


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


def find_checkpoint(path: str | Path, step: int | None = None) -> tuple[int | None, Path]:
    """The one resolver: (step, directory) of the torch_dist checkpoint `path` names. `path` is
    - a checkpoint root: its latest complete checkpoint (the tracker's), or that of `step` when given;
    - or one torch_dist directory (holding .metadata, e.g. ROOT/iter_000000N): itself, its step read
      from an iter_N name (else None).
    Raises CheckpointError naming what is missing (before any rank reads anything)."""
    path = Path(path)
    if step is not None:
        directory = iteration_dir(path, step)
        if not directory.is_dir():
            raise CheckpointError(f"{path} has no iteration {step} ({directory} is missing)")
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
    return step, iteration_dir(path, step)


def side_files(hf_dir: str | Path) -> list[Path]:
    """The regular files of an HF checkpoint directory other than weights: config.json, tokenizer
    files, generation_config.json, chat template, README, ... (what HF_CONFIG_DIR holds)."""
    out = []
    for path in sorted(Path(hf_dir).iterdir()):
        name = path.name
        if not path.is_file() or name.startswith(".") or name.endswith(_WEIGHT_INDEXES):
            continue
        if name.endswith(_WEIGHT_SUFFIXES):
            continue
        out.append(path)
    return out


def copy_side_files(hf_dir: str | Path, dest: str | Path, skip: tuple[str, ...] = ()) -> list[str]:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in side_files(hf_dir):
        if path.name not in skip:
            shutil.copyfile(path, dest / path.name)
            copied.append(path.name)
    return copied
