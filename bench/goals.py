"""Whether a bench row meets its goal: the table's "met" column (bench/run_all.py).

A goal is a comparison of the row's ratio with a number ("<= 1.5", ">= 2.77 (AReaL's ...)", "< 0.05",
"> 1") or "≈ 1" (within APPROX_TOLERANCE of 1). The verdict:
- "yes": the ratio meets it;
- "tie (noise ±N)": it misses by less than the row's own measured noise (the floor's spread between
  rounds, or the spread of the pairs' ratios): this run cannot tell it from the goal;
- "no: WHY": it misses, and the script measured why the goal is out of reach on this machine (the row's
  `why`, e.g. the engine's own rate bounds every schedule, or the medium SGLang offers is itself that
  far from the floor, measured bare in the same run);
- "NO": it misses, with no measured reason: a gap of ours to close.
A row without a goal, or without a ratio, gets no verdict.
"""

from __future__ import annotations

import operator
import re

WHY = "short_of_goal"  # a row's measured reason for missing its goal (bench_common.row's `why`)
APPROX_TOLERANCE = 0.1  # "≈ 1": within 10% of 1
_GOAL = re.compile(r"^\s*(<=|>=|<|>|≈)\s*([0-9]*\.?[0-9]+)")
_COMPARE = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def parse_goal(goal: str) -> tuple[str, float] | None:
    """(comparison, number) of a goal such as "<= 1.5 (why)", or None for "—" or free text."""
    match = _GOAL.match(goal or "")
    return (match.group(1), float(match.group(2))) if match else None


def shortfall(ratio: float, comparison: str, target: float) -> float:
    """How far `ratio` is from meeting the goal, in the ratio's units (0 when it meets it)."""
    if comparison == "≈":
        return max(0.0, abs(ratio - target) - APPROX_TOLERANCE * target)
    if _COMPARE[comparison](ratio, target):
        return 0.0
    return max(abs(ratio - target), 1e-12)  # a strict goal missed at equality ("< 1" at 1.0) is missed


def verdict(row: dict, noise_key: str) -> str:
    """The "met" cell of `row` (module docstring); `noise_key`: where the row keeps its noise."""
    goal, ratio = parse_goal(row.get("goal", "")), row.get("ratio")
    if goal is None or ratio is None:
        return ""
    short = shortfall(ratio, *goal)
    noise = row.get(noise_key) or 0.0
    if short == 0.0:
        return "yes"
    if short <= noise:
        return f"tie (noise ±{noise:.2g})"
    if row.get(WHY):
        return f"no: {row[WHY]}"
    return "NO"
