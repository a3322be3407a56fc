"""Directories of the disk transport: each sync writes a complete HF checkpoint (safetensors shards +
index, plus the served checkpoint's config and tokenizer files) into ROOT/.step_<v>.tmp, then renames
it to ROOT/step_<v>. An engine is only ever pointed at a renamed (complete) directory, so it never
reads a half-written file; the previous step's directory is removed once the engines have loaded
the new one. ROOT must be reachable by the stage-lead trainer ranks and every engine."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from lean_rl.weight_sync.errors import WeightSyncError

INDEX_FILE = "model.safetensors.index.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class DiskStaging:
    def __init__(self, root: str | Path | None, served_checkpoint: str | Path):
        self.served_checkpoint = Path(served_checkpoint)
        if not self.served_checkpoint.is_dir():
            raise WeightSyncError(f"disk transport: the served checkpoint {self.served_checkpoint} is not a "
                                  "directory here (its config/tokenizer files go with every sync)")
        self._owns_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="lean_rl_weight_sync_")) if root is None else Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WeightSyncError(f"--weight-sync-disk-dir {self.root}: cannot create it ({exc})") from exc
        self.published: Path | None = None

    def start(self, version: str) -> Path:
        """A fresh, empty directory for this sync's shards."""
        tmp = self.root / f".step_{version}.tmp"
        if tmp.exists():  # left by a sync that failed half-way
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp

    def publish(self, tmp: Path, version: str, weight_map: dict[str, str], total_bytes: int) -> Path:
        """Add the index and the served checkpoint's other files, then make the directory visible."""
        index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=1))
        for item in self.served_checkpoint.iterdir():
            if item.is_file() and item.name != INDEX_FILE and not item.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(item, tmp / item.name)
        final = self.root / f"step_{version}"
        if final.exists():  # the same version synced again; nobody reads it now (loads are synchronous)
            shutil.rmtree(final)
        tmp.rename(final)
        return final

    def loaded(self, directory: Path) -> None:
        """The engines now serve `directory`: the previous one can go."""
        previous, self.published = self.published, directory
        if previous is not None and previous != directory:
            shutil.rmtree(previous, ignore_errors=True)

    def close(self) -> None:
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
