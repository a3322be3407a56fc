"""Lazy reader for an HF safetensors checkpoint (single file or sharded with an index): `get(name)`
returns a safetensors slice, so a rank reads only the rows/columns it asks for."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from safetensors import safe_open

from lean_rl.backends.megatron.hf_weights.layouts import Sliceable

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class HFCheckpoint:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        single = self.directory / SINGLE_FILE
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, object] = {}
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: self.directory / file for name, file in weight_map.items()}
        elif single.is_file():
            self._file_of = {name: single for name in self._open(single).keys()}
        else:
            raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {self.directory}")

    def _open(self, path: Path):
        key = str(path)
        if key not in self._handles:
            self._handles[key] = self._stack.enter_context(safe_open(key, framework="pt", device="cpu"))
        return self._handles[key]

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def get(self, name: str) -> Sliceable:
        if name not in self._file_of:
            raise KeyError(f"tensor {name!r} is not in the HF checkpoint {self.directory}")
        return self._open(self._file_of[name]).get_slice(name)

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def __enter__(self) -> "HFCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
