"""The preference pairs of --prompt-data (--loss-type dpo_loss / rm_loss), read and checked row by row:
a leaf that start-up checks (rollout/preference_config.py) and the pairs' rollout (rollout/preference.py)
both read, so neither imports the other."""

from __future__ import annotations

import functools
from pathlib import Path

from lean_rl.buffer.prompt_source import _iter_rows


@functools.lru_cache(maxsize=4)
def read_pairs(path: str, chosen_key: str, rejected_key: str) -> dict[int, tuple[str, str]]:
    """{row number: (chosen, rejected)} of every row of `path`; a row without either field, or with one
    that is not text, is a ValueError naming the file, the row and the field."""
    pairs = {}
    for row_number, row, error in _iter_rows(Path(path)):
        if error or row is None:
            raise ValueError(f"--prompt-data {path} row {row_number}: {error}")
        texts = []
        for key, flag in ((chosen_key, "--chosen-key"), (rejected_key, "--rejected-key")):
            if key not in row:
                raise ValueError(f"--prompt-data {path} row {row_number}: missing field {key!r} ({flag}); "
                                 f"the row has {sorted(row)}")
            if not isinstance(row[key], str) or not row[key]:
                raise ValueError(f"--prompt-data {path} row {row_number}: field {key!r} ({flag}) must be non-empty "
                                 f"text, got {type(row[key]).__name__} {str(row[key])[:40]!r}")
            texts.append(row[key])
        pairs[row_number] = (texts[0], texts[1])
    return pairs
