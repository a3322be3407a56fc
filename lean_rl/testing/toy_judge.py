"""A judge's parser for tests and demos on the tiny (random) models, whose answers are no ratings:
it reads any answer, so the judge's path runs end to end (--judge-parser lean_rl.testing.toy_judge.answer_length)."""

from __future__ import annotations

WORDS_FOR_FULL_MARKS = 8


def answer_length(text: str) -> float | None:
    """The answer's word count / 8, at most 1: a number from any answer (None only for an empty one)."""
    words = len(text.split())
    return min(words / WORDS_FOR_FULL_MARKS, 1.0) if words else None
