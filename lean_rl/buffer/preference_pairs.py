"""The preference pairs of --prompt-data (--loss-type dpo_loss / rm_loss), read and checked row by row:
a leaf that start-up checks (rollout/preference_config.py) and the pairs' rollout (rollout/preference.py)
both read, so neither imports the other. A response is text, or the token ids a policy sampled (a list of
ints): pairs drawn from a policy's own samples (an iterated reward model) must be scored on the exact
tokens the served reward model will see, which decoding and re-tokenizing does not give back (a lone byte
token decodes to U+FFFD)."""

from __future__ import annotations

import functools
from pathlib import Path

from lean_rl.buffer.prompt_source import _iter_rows

Response = str | list[int]  # text, or token ids


def is_response(value: object) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


@functools.lru_cache(maxsize=4)
def read_pairs(path: str, chosen_key: str, rejected_key: str) -> dict[int, tuple[Response, Response]]:
    """{row number: (chosen, rejected)} of every row of `path`; a row without either field, or with one
    that is neither text nor token ids, is a ValueError naming the file, the row and the field."""
    pairs = {}
    for row_number, row, error in _iter_rows(Path(path)):
        if error or row is None:
            raise ValueError(f"--prompt-data {path} row {row_number}: {error}")
        texts: list[Response] = []
        for key, flag in ((chosen_key, "--chosen-key"), (rejected_key, "--rejected-key")):
            if key not in row:
                raise ValueError(f"--prompt-data {path} row {row_number}: missing field {key!r} ({flag}); "
                                 f"the row has {sorted(row)}")
            if not is_response(row[key]):
                raise ValueError(f"--prompt-data {path} row {row_number}: field {key!r} ({flag}) must be non-empty "
                                 f"text or a non-empty list of token ids, got {type(row[key]).__name__} "
                                 f"{str(row[key])[:40]!r}")
            texts.append(row[key])
        pairs[row_number] = (texts[0], texts[1])
    return pairs
