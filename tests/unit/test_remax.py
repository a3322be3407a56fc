"""--advantage-estimator remax (ReMax, Li et al. 2023): A_i = r_i - b_g, b_g the reward of the prompt's
greedy response, which the rollout (GroupRunner) generates beside the group and never trains. The
formula is written out here; the rollout side runs the real GroupRunner with a scripted generate
function (an extension point, not the component under test) that answers by temperature."""

import argparse
import asyncio
import math
import types

import pytest
import torch

from lean_rl.algorithms.advantages import compute_advantages
from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.hooks import AdvantageInputs, builtin_advantages
from lean_rl.backends.megatron.rollout_batch import rollout_batch
from lean_rl.options import add_options, read_options
from lean_rl.hook_protocols import Extensions
from lean_rl.rollout.group_runner import GREEDY_BASELINE_TOP_INDEX, GroupRunner
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.sample import REMAX_BASELINE_REWARD, Sample, Status
from tests.unit.stand_ins import RecordingBuffer

# group 7: rewards 1, 0, 1   greedy baseline 0.5  ->  A = 0.5, -0.5, 0.5
# group 3: rewards 2, 5      greedy baseline 4    ->  A = -2, 1
REWARDS = torch.tensor([1.0, 0.0, 1.0, 2.0, 5.0])
BASELINES = torch.tensor([0.5, 0.5, 0.5, 4.0, 4.0])
GROUPS = torch.tensor([7, 7, 7, 3, 3])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)


def test_remax_subtracts_the_greedy_reward_and_broadcasts_to_the_trained_tokens():
    advantages, returns = compute_advantages("remax", REWARDS, GROUPS, MASK, baselines=BASELINES)
    assert returns is None
    expected = torch.tensor([[0.5, 0.5, 0], [-0.5, 0, 0], [0.5, 0, 0.5], [-2, -2, -2], [1, 0, 0]])
    assert torch.equal(advantages, expected)  # no std division, no whitening


def test_remax_failed_samples_get_zero_and_need_no_baseline():
    valid = torch.tensor([True, False, True, True, True])
    baselines = BASELINES.clone()
    baselines[1] = math.nan  # a FAILED sample's baseline does not matter
    advantages, _ = compute_advantages("remax", REWARDS, GROUPS, MASK, baselines=baselines, valid=valid)
    assert advantages[1].abs().sum() == 0
    assert advantages[0].tolist() == [0.5, 0.5, 0.0] and advantages[3].tolist() == [-2.0, -2.0, -2.0]


def test_remax_with_normalize_whitens_the_same_values():
    advantages, _ = compute_advantages("remax", REWARDS, GROUPS, MASK, baselines=BASELINES, normalize=True)
    # trained tokens: 0.5 x2, -0.5, 0.5 x2, -2 x3, 1  (9 tokens, sum -3, mean -1/3)
    values = torch.tensor([0.5, 0.5, -0.5, 0.5, 0.5, -2, -2, -2, 1.0])
    mean, var = values.mean(), values.var(unbiased=True)
    assert advantages[0, 0] == pytest.approx(float((0.5 - mean) / math.sqrt(var + 1e-8)), rel=1e-5)
    assert advantages[3, 2] == pytest.approx(float((-2 - mean) / math.sqrt(var + 1e-8)), rel=1e-5)


def test_remax_without_a_baseline_names_the_flag_and_the_metadata_key():
    baselines = BASELINES.clone()
    baselines[3] = math.nan
    with pytest.raises(ValueError, match=r"--advantage-estimator remax needs .*metadata\['remax_baseline_reward'\].*"
                                         r"rows \[3\]"):
        compute_advantages("remax", REWARDS, GROUPS, MASK, baselines=baselines)
    with pytest.raises(ValueError, match="--advantage-estimator remax needs"):
        compute_advantages("remax", REWARDS, GROUPS, MASK)


def _sample(index, group, reward, baseline=None):
    s = Sample(index=index, group_index=group, prompt="p", tokens=[5, 6])
    s.append_response([7, 8], log_probs=[-1.0, -2.0], weight_versions=0)
    s.status, s.reward = Status.COMPLETED, reward
    if baseline is not None:
        s.metadata[REMAX_BASELINE_REWARD] = baseline
    return s


def test_the_flag_parses_and_the_driver_path_passes_the_baseline_from_the_samples():
    parser = add_options(argparse.ArgumentParser(), AlgorithmConfig)
    algo = read_options(AlgorithmConfig, parser.parse_args(["--advantage-estimator", "remax"]))
    assert algo.advantage_estimator == "remax" and algo.policy_loss == "ppo" and algo.aggregation == "token-mean"
    assert not algo.needs_critic and not algo.needs_reference
    batch = rollout_batch([[_sample(0, 0, 1.0, 0.25), _sample(1, 0, 0.0, 0.25)], [_sample(2, 1, 1.0)]])
    assert batch.baseline_rewards[:2].tolist() == [0.25, 0.25] and math.isnan(batch.baseline_rewards[2])
    inputs = AdvantageInputs(rewards=batch.rewards[:2], group_ids=batch.group_ids[:2], mask=batch.masks[:2],
                             valid=batch.valid[:2], rollout_log_probs=batch.rollout_log_probs[:2],
                             baseline_rewards=batch.baseline_rewards[:2])
    advantages, _ = builtin_advantages(algo, inputs)
    assert advantages.tolist() == [[0.75, 0.75], [-0.25, -0.25]]
    with pytest.raises(ValueError, match="remax_baseline_reward"):  # a custom rollout that sets no baseline
        builtin_advantages(algo, AdvantageInputs(
            rewards=batch.rewards, group_ids=batch.group_ids, mask=batch.masks, valid=batch.valid,
            rollout_log_probs=batch.rollout_log_probs, baseline_rewards=batch.baseline_rewards))


# ---------------------------------------------------------------- the rollout side


def _cfg(estimator):
    return types.SimpleNamespace(
        reward=types.SimpleNamespace(rm_timeout=5.0, rm_retries=0, rm_url=None, custom_rm_path="my.rm",
                                     rm_type=None, reward_key=None),
        rollout=types.SimpleNamespace(max_concurrency=8, custom_generate_function_path="my.gen",
                                      generate_function_flag="--custom-generate-function-path my.gen",
                                      sampling=types.SimpleNamespace(
                                          to_sglang=lambda: {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 4})),
        algorithm=types.SimpleNamespace(advantage_estimator=estimator),
        run=types.SimpleNamespace(debug_rollout_only=False))


def _run(estimator="remax", greedy="ok", sampled_token=lambda s: 3 + s.index % 2):
    """One group of 3 through GroupRunner: sampled responses get one token (3 or 4), the greedy one
    token 9 (`greedy`: 'ok', 'raise', 'abort', 'bad_reward'); the reward is the token / 10."""
    seen = []

    async def gen(cfg, sample, params):
        seen.append((sample.index, dict(params), list(sample.tokens), dict(sample.metadata)))
        if params["temperature"] == 0.0:
            if greedy == "raise":
                raise RuntimeError("engine gone")
            if greedy == "abort":
                sample.status = Status.ABORTED
                return sample
            token = 9
        else:
            token = sampled_token(sample)
        sample.append_response([token], text=str(token), log_probs=[-0.5], weight_versions=0)
        sample.status = Status.COMPLETED
        return sample

    async def rm(cfg, sample):
        if greedy == "bad_reward" and sample.response_tokens == [9]:
            raise ValueError("reward service down")
        return sample.response_tokens[0] / 10

    buffer = RecordingBuffer()
    runner = GroupRunner(_cfg(estimator), buffer, Extensions(rollout=None, generate=gen, reward=rm,
                                                             group_reward=False, dynamic_filter=None),
                         keep_partial_tokens=True)
    group = [Sample(index=i, group_index=5, prompt="p", tokens=[1, 2], label="x", metadata={"row": 1})
             for i in range(3)]
    group[0].metadata["generate_retries"] = 2  # left by an earlier attempt: not the baseline's
    kept = asyncio.run(runner.run_group(group))
    return kept, buffer, runner, seen


def test_the_rollout_scores_one_greedy_response_per_group_and_records_it_on_every_sample():
    kept, buffer, runner, seen = _run()
    assert buffer.finished == [kept] and len(kept) == 3  # the baseline is not in the group
    assert [s.metadata[REMAX_BASELINE_REWARD] for s in kept] == [0.9, 0.9, 0.9]
    assert [s.reward for s in kept] == [0.3, 0.4, 0.3]
    greedy = [call for call in seen if call[1]["temperature"] == 0.0]
    assert len(greedy) == 1 and len(seen) == 4
    index, params, tokens, metadata = greedy[0]
    assert params == {"temperature": 0.0, "top_p": 0.9, "max_new_tokens": 4}  # the rollout's params, greedy
    assert index == GREEDY_BASELINE_TOP_INDEX - 5 and tokens == [1, 2] and metadata == {"row": 1}
    assert rollout_metrics([kept])["rollout/remax_baseline_reward_mean"] == pytest.approx(0.9)


def test_without_remax_no_baseline_is_generated():
    kept, _, _, seen = _run("grpo")
    assert len(seen) == 3 and all(REMAX_BASELINE_REWARD not in s.metadata for s in kept)
    assert "rollout/remax_baseline_reward_mean" not in rollout_metrics([kept])


@pytest.mark.parametrize("greedy", ["raise", "bad_reward"])
def test_a_failed_baseline_drops_the_group_and_counts_it(greedy):
    kept, buffer, runner, _ = _run(greedy=greedy)
    assert kept is None and not buffer.finished and not buffer.partial
    assert [reason for reason, _ in buffer.dropped] == ["remax_baseline_failed"]
    assert runner.counters["remax_baseline_failed"] == 1 and runner.counters["reward_failed"] == 0


def test_an_aborted_baseline_sends_the_group_back_as_partial():
    kept, buffer, runner, _ = _run(greedy="abort")
    assert kept is None and not buffer.finished and not buffer.dropped
    assert len(buffer.partial) == 1 and len(buffer.partial[0]) == 3
    assert all(s.status == Status.COMPLETED for s in buffer.partial[0])  # partial rollout: kept, baseline redone
