"""--ci-test's checks on a step's metrics (lean_rl/ci_test.py)."""

import types

import pytest

from lean_rl.ci_test import CITestFailed, check_step


def cfg(async_mode="off", bound=0.02):
    return types.SimpleNamespace(run=types.SimpleNamespace(async_mode=async_mode, ci_test_max_mismatch=bound))


GOOD = {"train/rollout_logprob_abs_diff": 1e-5, "train/mismatch_kl": 1e-9, "train/old_ref_max_abs_diff": 0.0}


def test_a_healthy_step_passes():
    check_step(cfg(), 0, GOOD)
    check_step(cfg(), 7, {**GOOD, "train/old_ref_max_abs_diff": 0.3})  # the reference is compared at step 0 only


@pytest.mark.parametrize("changed, message", [
    ({"train/rollout_logprob_abs_diff": 0.5}, r"rollout_logprob_abs_diff = 0.5 > --ci-test-max-mismatch 0.02"),
    ({"train/mismatch_kl": float("nan")}, r"mismatch_kl = nan"),
    ({"train/old_ref_max_abs_diff": 1e-3}, r"old_ref_max_abs_diff = 0.001 > 1e-06: the reference model differs"),
])
def test_step_0_checks_name_the_metric_and_the_bound(changed, message):
    with pytest.raises(CITestFailed, match=r"^--ci-test: step 0: .*" + message):
        check_step(cfg(), 0, {**GOOD, **changed})


def test_later_steps_are_bounded_in_sync_runs_only():
    drifted = {**GOOD, "train/rollout_logprob_abs_diff": 0.5}
    with pytest.raises(CITestFailed, match="step 3"):
        check_step(cfg(), 3, drifted)
    check_step(cfg("full"), 3, drifted)  # async: a later step's mismatch includes the policy lag
    with pytest.raises(CITestFailed, match="was not logged"):
        check_step(cfg("full"), 0, {})
