"""An HF checkpoint's side files (config.json, tokenizer files, generation_config.json, chat template,
README, ...): what a Megatron checkpoint keeps in its HF_CONFIG_DIR (checkpoint_paths.py) and what the
converters copy beside the weights they write. Pure stdlib."""

from __future__ import annotations

import shutil
from pathlib import Path

# Weight files and indexes are never copied as side files: the converters write their own.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".distcp")
_WEIGHT_INDEXES = (".safetensors.index.json", ".bin.index.json")


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
