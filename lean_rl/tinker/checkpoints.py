"""Where save_state puts a training client's state, and how load_state finds it again.

A state is a directory STATE_DIR/<model id>/<name>/ (the server's --state-dir): one rank<N>.pt per
trainer rank (its adapter parameters and Adam state: backends/megatron/tinker_rank.py) and meta.json
(base model, LoRA rank, trainer ranks), which load_state checks before any rank reads a file. Its
Tinker path is tinker://<model id>/weights/<name>; it outlives the server and the client (resume), and
loads at the same trainer layout only."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from lean_rl.tinker.futures import UserError

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_SCHEME = "tinker://"


@dataclass(frozen=True)
class StateMeta:
    base_model: str
    lora_rank: int
    ranks: int


def _part(value: str, what: str) -> str:
    if not _PART.fullmatch(value) or ".." in value:
        raise UserError(f"{what} {value!r}: letters, digits, '-', '_', '.', ':' only")
    return value


def tinker_path(model_id: str, name: str) -> str:
    return f"{_SCHEME}{model_id}/weights/{name}"


def state_dir(root: Path, model_id: str, name: str) -> Path:
    return root / _part(model_id, "model_id") / _part(name, "state name")


def parse_path(root: Path, path: str) -> Path:
    """The directory of a tinker://<model id>/weights/<name> path (a UserError for any other path)."""
    model_id, sep, name = path.removeprefix(_SCHEME).rpartition("/weights/")
    if not path.startswith(_SCHEME) or not sep:
        raise UserError(f"path {path!r}: expected tinker://<model id>/weights/<name> (a save_state path)")
    return state_dir(root, model_id, name)


def write_meta(directory: Path, meta: StateMeta) -> None:
    (directory / "meta.json").write_text(json.dumps(asdict(meta)))


def check_meta(directory: Path, path: str, expected: StateMeta) -> None:
    """A UserError unless `directory` holds a complete state that fits this server."""
    try:
        found = StateMeta(**json.loads((directory / "meta.json").read_text()))
    except FileNotFoundError:
        raise UserError(f"path {path!r}: no such saved state on this server (--state-dir)") from None
    except (ValueError, TypeError) as err:
        raise UserError(f"path {path!r}: its meta.json is unreadable ({err})") from None
    for field in ("base_model", "lora_rank", "ranks"):
        if getattr(found, field) != getattr(expected, field):
            raise UserError(f"path {path!r}: saved with {field} {getattr(found, field)!r}, this server has "
                            f"{getattr(expected, field)!r}")
    missing = [r for r in range(found.ranks) if not (directory / f"rank{r}.pt").is_file()]
    if missing:
        raise UserError(f"path {path!r}: the state lacks rank{missing[0]}.pt")
