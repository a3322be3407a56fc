"""Sample groups -> training tensors: FAILED samples are marked not valid, left out of group statistics,
and get zero loss weight."""

import pytest
import torch

from lean_rl.algorithms.advantages import compute_advantages
from lean_rl.backends.megatron.rollout_batch import batch_metrics, pad, rollout_batch
from lean_rl.sample import NOT_GENERATED, Sample, Status


def _sample(index, group, reward, status=Status.COMPLETED, version=0, tool=False):
    s = Sample(index=index, group_index=group, prompt="p", tokens=[5, 6])
    s.append_response([7, 8], log_probs=[-1.0, -2.0], weight_versions=version)
    if tool:
        s.append_response([9], trainable=False)
    s.status, s.reward = status, reward
    return s


def test_failed_samples_are_left_out_of_the_group_and_train_nothing():
    groups = [[_sample(0, 0, 1.0), _sample(1, 0, None, Status.FAILED), _sample(2, 0, 0.0)],
              [_sample(3, 1, 1.0, tool=True)]]
    groups[0][1].metadata["generate_error"] = "EngineConnectionError: router gone"
    batch = rollout_batch(groups)
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]  # the failed reward is stored as 0 ...
    assert batch.valid.tolist() == [True, False, True, True]  # ... and marked as no data
    assert batch.failed == 1 and batch.failed_fraction == 0.25
    assert batch.failures == ("sample 1 (group 0) generate_error: EngineConnectionError: router gone",)
    assert batch.masks.tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 0], [1, 1, 0]]  # [B, T], response-aligned
    assert batch.rollout_log_probs.tolist() == [[-1, -2, 0]] * 4
    advantages, _ = compute_advantages("dr_grpo", batch.rewards, batch.group_ids, batch.masks, valid=batch.valid)
    # group 0 is [1, 0]: mean 0.5 (with the failed sample as a 0 it would be 1/3)
    assert advantages[0].tolist() == [0.5, 0.5, 0.0] and advantages[2].tolist() == [-0.5, -0.5, 0.0]
    assert advantages[1].abs().sum() == 0
    assert [s.response_length for s in batch.sequences] == [2, 2, 2, 3]
    assert batch.weight_versions[3].tolist() == [0, 0, NOT_GENERATED]


def test_unscored_sample_is_an_error_and_metrics_count_stale_tokens_and_the_trained_reward():
    with pytest.raises(ValueError, match="sample 0 .* has no reward"):
        rollout_batch([[_sample(0, 0, None)]])
    batch = rollout_batch([[_sample(0, 0, 1.0, version=3), _sample(1, 0, float("nan"), version=5)]])
    metrics = batch_metrics(batch, policy_version=5)
    assert metrics["rollout/stale_token_frac"] == 0.5 and metrics["rollout/max_staleness"] == 2
    assert metrics["rollout/nonfinite_rewards"] == 1
    failed = batch_metrics(rollout_batch([[_sample(0, 0, 1.0), _sample(1, 0, None, Status.FAILED)]]), 0)
    assert failed["train/reward_mean"] == 1.0  # the reward as trained: the FAILED sample is not
    assert failed["rollout/failed_samples"] == 1 and failed["rollout/failed_frac"] == 0.5
    assert metrics["rollout/failed_samples"] == 0 and metrics["rollout/failed_frac"] == 0
    assert not any(key.endswith("reward_mean") and key != "train/reward_mean" for key in metrics)


def test_pad_right_pads_response_aligned_vectors():
    values = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    assert pad(values).tolist() == [[1.0, 2.0], [3.0, 0.0]]
    assert pad(values, 3).tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
