"""--max-failed-fraction: a rollout where too many samples FAILED (engines, router, reward function)
stops the run before anything of it is trained, with a message that names the flag, the counts and
the first failure reasons."""

import argparse

import pytest

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.rollout_batch import FailedSamplesError, check_failed_fraction, rollout_batch
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.options import ConfigError, add_options, build, read_options
from lean_rl.sample import Sample, Status
from tests.unit.stand_ins import RefusingActor


def _sample(index, group, failed=None):
    s = Sample(index=index, group_index=group, prompt="p", tokens=[5, 6])
    s.append_response([7], log_probs=[-1.0], weight_versions=0)
    s.status, s.reward = Status.COMPLETED, 1.0
    if failed is not None:
        key, error = failed
        s.status, s.reward = Status.FAILED, 0.0
        s.metadata[key] = error
    return s


def _groups(num_failed: int, size: int = 4, num_groups: int = 2):
    reasons = [("reward_error", "TimeoutError: reward server"), ("generate_error", "EngineHTTPError: 503"),
               ("custom_error", "tool crashed")]
    groups, k = [], 0
    for g in range(num_groups):
        group = []
        for i in range(size):
            index = g * size + i
            group.append(_sample(index, g, reasons[k % 3] if k < num_failed else None))
            k += 1
        groups.append(group)
    return groups


def test_up_to_the_fraction_passes_and_past_it_stops_with_the_flag_counts_and_reasons():
    check_failed_fraction(rollout_batch(_groups(4)), 0.5)  # 4 of 8: not more than half
    check_failed_fraction(rollout_batch(_groups(0)), 0.0)
    check_failed_fraction(rollout_batch(_groups(8)), 1.0)  # 1: the check never stops the run
    with pytest.raises(FailedSamplesError) as err:
        check_failed_fraction(rollout_batch(_groups(5)), 0.5)
    message = str(err.value)
    assert "5 of 8 samples" in message and "(62%)" in message and "--max-failed-fraction 0.5" in message
    assert "sample 0 (group 0) reward_error: TimeoutError: reward server" in message
    assert "sample 1 (group 0) generate_error: EngineHTTPError: 503" in message
    assert "sample 2 (group 0) custom_error: tool crashed" in message
    assert "sample 3 " not in message and "(and 2 more)" in message
    with pytest.raises(FailedSamplesError, match=r"1 of 8 samples .*--max-failed-fraction 0\.0 "):
        check_failed_fraction(rollout_batch(_groups(1)), 0.0)


def test_the_flag_defaults_to_half_and_is_checked():
    assert build(AlgorithmConfig).max_failed_fraction == 0.5
    parser = argparse.ArgumentParser()
    add_options(parser, AlgorithmConfig)
    assert read_options(AlgorithmConfig, parser.parse_args(["--max-failed-fraction", "0.1"])).max_failed_fraction == 0.1
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="--max-failed-fraction"):
            build(AlgorithmConfig, max_failed_fraction=bad)


def test_train_on_rollout_refuses_the_rollout_before_any_forward_pass_or_optimizer_step():
    with pytest.raises(FailedSamplesError, match="--max-failed-fraction 0.25"):
        train_on_rollout(RefusingActor(build(AlgorithmConfig, max_failed_fraction=0.25)), _groups(3), policy_version=0)
    # every sample FAILED: the flag's message, not the optimizer step's "no trainable token"
    with pytest.raises(FailedSamplesError, match="8 of 8 samples"):
        train_on_rollout(RefusingActor(build(AlgorithmConfig)), _groups(8), policy_version=0)
