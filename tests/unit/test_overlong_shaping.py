"""DAPO's soft over-long punishment (lean_rl/algorithms/overlong.py) by hand and against verl's DAPO
reward manager formula: min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0)."""

import pytest

from lean_rl.algorithms.overlong import overlong_penalty


def _verl(length, max_len, buffer_len, factor):
    return min(-(length - (max_len - buffer_len)) / buffer_len * factor, 0)


def test_by_hand():
    # L_max 20, L_cache 5: no penalty up to 15 tokens, then -0.2 per token down to -1 at 20
    assert overlong_penalty(10, 20, 5) == 0.0
    assert overlong_penalty(15, 20, 5) == 0.0
    assert overlong_penalty(16, 20, 5) == pytest.approx(-0.2)
    assert overlong_penalty(18, 20, 5, penalty_factor=0.5) == pytest.approx(-0.3)
    assert overlong_penalty(20, 20, 5) == pytest.approx(-1.0)
    assert overlong_penalty(25, 20, 5) == -1.0  # past the budget (a multi-turn sample's total): -factor


@pytest.mark.parametrize("buffer_len,factor", [(1, 1.0), (4, 0.5), (16, 2.0), (32, 1.0)])
def test_matches_verl(buffer_len, factor):
    for length in range(0, 33):
        assert overlong_penalty(length, 32, buffer_len, factor) == pytest.approx(_verl(length, 32, buffer_len, factor))


def test_bad_buffer():
    with pytest.raises(ValueError, match="--overlong-buffer-len must be in"):
        overlong_penalty(3, 8, 9)
