"""Output directories that appear only when complete, and the HF side files (config, tokenizer,
generation config, chat template) that travel with the weights."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

# Weight files and indexes are never copied as "side files": the converters write their own.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".distcp")
_WEIGHT_INDEXES = (".safetensors.index.json", ".bin.index.json")


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


def side_files(hf_dir: str | Path) -> list[Path]:
    """The regular files of an HF checkpoint directory other than weights: config.json, tokenizer
    files, generation_config.json, chat template, README, ..."""
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
