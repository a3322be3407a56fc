"""bench/rollout_throughput.py's per-pair ratios (wall time and client CPU rows) and the per-token
versions of a generate answer (lean_rl/rollout/generate.py token_versions): pure logic."""

from __future__ import annotations

import pytest

from bench_scripts import import_bench
from lean_rl.backends.sglang.responses import GenerateResult, WeightVersionSpan
from lean_rl.rollout.generate import token_versions


@pytest.fixture(scope="module")
def rollout_bench():
    return import_bench("rollout_throughput")


def test_pair_ratios_are_per_pair_with_median_quartiles_and_noise(rollout_bench):
    # pairs: ours / floor = 1.0, 2.0, 1.5, 3.0, 1.2; a slow floor round does not hide a slow ours elsewhere
    ratios = rollout_bench.pair_ratios([2.0, 4.0, 3.0, 6.0, 1.2], [2.0, 2.0, 2.0, 2.0, 1.0])
    assert ratios.ratios == (1.0, 2.0, 1.5, 3.0, 1.2)
    assert ratios.median == 1.5
    assert (ratios.low, ratios.high) == pytest.approx((1.1, 2.5))  # statistics.quantiles, exclusive method
    assert ratios.noise == pytest.approx(0.7)
    assert ratios.describe() == "median of pairs 1.500 (quartiles 1.100..2.500, all 1.000..3.000)"


def test_one_pair_has_no_spread_and_unpaired_rounds_are_refused(rollout_bench):
    one = rollout_bench.pair_ratios([3.0], [2.0])
    assert (one.median, one.low, one.high, one.noise) == (1.5, 1.5, 1.5, 0.0)
    with pytest.raises(ValueError, match="3 rounds of ours, 2 of the floor"):
        rollout_bench.pair_ratios([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="0 rounds of ours"):
        rollout_bench.pair_ratios([], [])


def _result(count: int, version: str | None, spans: tuple[tuple[str, int, int], ...]) -> GenerateResult:
    return GenerateResult(output_ids=list(range(count)), output_log_probs=[0.0] * count, finish_reason="length",
                          finish_detail=count, weight_version=version,
                          weight_version_spans=tuple(WeightVersionSpan(*span) for span in spans),
                          prompt_tokens=3, completion_tokens=count, cached_tokens=0, rid="r", text=None)


def test_token_versions_take_each_span_and_the_final_version_elsewhere():
    assert token_versions(_result(4, "7", ())) == [7, 7, 7, 7]
    assert token_versions(_result(3, "default", (("default", 0, 3),))) == [0, 0, 0]  # SGLang's initial weights
    # weights changed mid-request: tokens 0-1 by version 2, 2-4 by version 3
    assert token_versions(_result(5, "3", (("2", 0, 2), ("3", 2, 5)))) == [2, 2, 3, 3, 3]
    # spans reaching outside the output are clipped; an empty or inverted one changes nothing; later spans win
    assert token_versions(_result(4, "5", (("1", -2, 1), ("2", 3, 9), ("4", 2, 2), ("6", 3, 1)))) == [1, 5, 5, 2]
    assert token_versions(_result(4, "5", (("1", 0, 4), ("2", 1, 3)))) == [1, 2, 2, 1]
    assert token_versions(_result(0, "5", (("1", 0, 4),))) == []
