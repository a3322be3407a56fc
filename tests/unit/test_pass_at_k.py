"""pass@k (rollout/pass_at_k.py) against hand-computed values, the formula 1 - C(n-c,k)/C(n,k) and an
enumeration of every draw; the k's of the evaluation sets (--eval-pass-k, a set's pass_k)."""

import itertools
import math

import pytest

from lean_rl.options import ConfigError
from lean_rl.rollout.eval_config import EvalConfig
from lean_rl.rollout.pass_at_k import ks_of, mean_pass_at_k, pass_at_k


def _by_enumeration(n: int, correct: int, k: int) -> float:
    """The fraction of the C(n, k) draws of k samples that hold at least one of the `correct` ones."""
    draws = list(itertools.combinations(range(n), k))
    return sum(any(i < correct for i in draw) for draw in draws) / len(draws)


def test_hand_computed_values():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the fraction correct
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0  # pass@n: any correct
    assert pass_at_k(6, 4, 3) == 1.0  # only 2 wrong: every draw of 3 holds a correct one


@pytest.mark.parametrize("n", range(1, 8))
def test_the_standard_formula_and_every_draw(n):
    for correct in range(n + 1):
        for k in range(1, n + 1):
            formula = 1 - math.comb(n - correct, k) / math.comb(n, k)
            assert pass_at_k(n, correct, k) == pytest.approx(formula, abs=1e-12)
            assert pass_at_k(n, correct, k) == pytest.approx(_by_enumeration(n, correct, k), abs=1e-12)


def test_a_bad_k_or_count_is_an_error_not_a_number():
    for n, c, k in [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="no prompts"):
        mean_pass_at_k([], 4, 1)


def test_a_sets_pass_at_k_is_the_mean_over_its_prompts():
    assert mean_pass_at_k([0, 2, 4], 4, 2) == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)


def test_which_ks():
    assert ks_of((), 8, "x") == (1, 8) and ks_of((), 1, "x") == (1,)
    assert ks_of((4, 1, 4), 8, "x") == (1, 4)
    for bad in (0, 9, 2.5, True):
        with pytest.raises(ConfigError, match=r"^--eval-pass-k: pass@k needs an integer k"):
            ks_of((bad,), 8, "--eval-pass-k")


def _sets(tmp_path, yaml_text: str | None, pass_k=(), n=1):
    import yaml

    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n')
    ev = EvalConfig(datasets=() if yaml_text else (("main", str(tmp_path / "p.jsonl")),), pass_k=pass_k,
                    n_samples_per_prompt=n)
    return ev.with_sets(yaml.safe_load(yaml_text.format(p=tmp_path / "p.jsonl")) if yaml_text else None).sets


def test_eval_sets_take_their_ks_from_the_flag_or_their_own_key(tmp_path):
    assert _sets(tmp_path, None, n=4)[0].ks == (1, 4)
    assert _sets(tmp_path, None, pass_k=(2,), n=4)[0].ks == (2,)
    config = """eval:
  defaults: {{n_samples_per_eval_prompt: 8}}
  datasets:
    - {{name: a, path: {p}, pass_k: [1, 8]}}
    - {{name: b, path: {p}, pass_k: 2}}
    - {{name: c, path: {p}}}
"""
    a, b, c = _sets(tmp_path, config, pass_k=(4,))
    assert (a.ks, b.ks, c.ks) == ((1, 8), (2,), (4,))


def test_a_k_past_a_sets_samples_is_one_line_naming_the_set(tmp_path):
    with pytest.raises(ConfigError, match=r"--eval-pass-k \(set main\): .*\(2\), got 4"):
        _sets(tmp_path, None, pass_k=(4,), n=2)
    config = "eval:\n  datasets:\n    - {{name: small, path: {p}, n_samples_per_eval_prompt: 2, pass_k: [3]}}\n"
    with pytest.raises(ConfigError, match=r"small: pass_k: pass@k needs .*\(2\), got 3"):
        _sets(tmp_path, config)
