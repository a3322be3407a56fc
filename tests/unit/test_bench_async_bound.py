"""bench/async_vs_sync.py's engine bound: sync's tokens at the fastest busy rate any mode reached, plus the weight loads."""

from __future__ import annotations

import pytest

from bench_scripts import import_bench


@pytest.fixture(scope="module")
def async_vs_sync():
    return import_bench("async_vs_sync")


def step(seconds: float, engine_idle: float, tokens: float, sync: float = 0.2) -> dict:
    return {"time/step": seconds, "time/trainer_idle": seconds - 0.1, "time/engine_idle": engine_idle,
            "perf/overhead_frac": 0.0, "time/train": 0.1, "rollout/response_tokens": tokens, "time/sync": sync}


def test_busy_rate_excludes_the_first_step_and_the_engines_idle_time(async_vs_sync):
    rows = [step(100.0, 0.0, 1.0), step(4.0, 2.0, 200.0), step(4.0, 0.0, 400.0)]
    summary = async_vs_sync.summarize(rows)
    assert summary["wall_s"] == 8.0
    assert summary["busy_tok_s"] == pytest.approx(600.0 / 6.0)


def test_the_counted_steps_weight_syncs_and_the_shortest_of_them(async_vs_sync):
    rows = [step(100.0, 0.0, 1.0, sync=0.01), step(4.0, 2.0, 200.0, sync=0.3), step(4.0, 0.0, 400.0, sync=0.2)]
    summary = async_vs_sync.summarize(rows)
    assert summary["syncs"] == 2 and summary["shortest_sync_s"] == 0.2  # the first step's is not counted


def test_the_bound_is_syncs_tokens_at_the_fastest_modes_busy_rate_plus_its_shortest_weight_loads(async_vs_sync):
    results = {"sync": {"tokens": 1000.0, "busy_tok_s": 100.0, "wall_s": 12.0, "syncs": 4, "shortest_sync_s": 0.5},
               "full": {"tokens": 1100.0, "busy_tok_s": 250.0, "wall_s": 5.0, "syncs": 4, "shortest_sync_s": 0.25},
               "one-step": {"tokens": 1000.0, "busy_tok_s": 150.0, "wall_s": 8.0, "syncs": 4, "shortest_sync_s": 0.3}}
    assert async_vs_sync.engine_bound(results) == ("full", pytest.approx(4.0 + 4 * 0.25), pytest.approx(1.0))
