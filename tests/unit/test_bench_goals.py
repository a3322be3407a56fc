"""bench/goals.py: the "met" column of bench/run_all.py's table."""

from __future__ import annotations

import pytest

from bench_scripts import import_bench


@pytest.fixture(scope="module")
def bench():
    return import_bench("goals"), import_bench("bench_common")


def test_goals_parse_with_their_explanations_and_free_text_has_none(bench):
    goals, _ = bench
    assert goals.parse_goal("<= 1.5") == ("<=", 1.5)
    assert goals.parse_goal(">= 2.77 (AReaL's, where generation dominates)") == (">=", 2.77)
    assert goals.parse_goal("< 0.05") == ("<", 0.05)
    assert goals.parse_goal("≈ 1") == ("≈", 1.0)
    assert goals.parse_goal("—") is None and goals.parse_goal("fast") is None


@pytest.mark.parametrize("ratio, goal, noise, why, expected", [
    (1.4, "<= 1.5", 0.0, None, "yes"),
    (1.5, "<= 1.5", 0.0, None, "yes"),
    (1.6, "<= 1.5", 0.0, None, "NO"),
    (1.6, "<= 1.5", 0.15, None, "tie (noise ±0.15)"),
    (1.6, "<= 1.5", 0.05, "the medium is 2x", "no: the medium is 2x"),
    (2.9, ">= 2.77 (AReaL's)", 0.0, None, "yes"),
    (1.3, ">= 2.77 (AReaL's)", 0.0, "the engine bound is 1.7x", "no: the engine bound is 1.7x"),
    (1.05, "≈ 1", 0.0, None, "yes"),
    (0.93, "≈ 1", 0.0, None, "yes"),
    (1.29, "≈ 1", 0.0, None, "NO"),
    (1.29, "≈ 1", 0.25, None, "tie (noise ±0.25)"),
    (1.0, "< 1", 0.0, None, "NO"),
    (3.0, "—", 0.0, None, ""),
    (None, "<= 2", 0.0, None, ""),
])
def test_verdict(bench, ratio, goal, noise, why, expected):
    goals, common = bench
    r = common.row("w", "f", "fl", ratio, goal, "c", noise=noise, why=why)
    assert goals.verdict(r, common.NOISE) == expected


def test_a_reason_never_hides_a_met_goal_or_a_tie(bench):
    goals, common = bench
    assert goals.verdict(common.row("w", "f", "fl", 1.2, "<= 1.5", "c", why="x"), common.NOISE) == "yes"
    assert goals.verdict(common.row("w", "f", "fl", 1.6, "<= 1.5", "c", noise=0.2, why="x"), common.NOISE).startswith("tie")
