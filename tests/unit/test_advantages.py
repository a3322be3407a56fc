"""Advantage estimators against values worked out by hand (the arithmetic is spelled out here, never
computed by the code under test)."""

import itertools
import math

import pytest
import torch

from lean_rl.algorithms.advantages import compute_advantages, group_normalized, leave_one_out
from lean_rl.algorithms.token_returns import discounted_returns, gae, masked_whiten
from lean_rl.options import build
from lean_rl.algorithms.config import AlgorithmConfig

# group 0: rewards 1, 0        mean 0.5, unbiased std sqrt(0.5) = 0.7071068
# group 1: rewards 2, 2, 5     mean 3, deviations -1 -1 2, unbiased var 6/2 = 3, std 1.7320508
REWARDS = torch.tensor([1.0, 0.0, 2.0, 2.0, 5.0])
GROUPS = torch.tensor([7, 7, 3, 3, 3])  # ids need not be contiguous or sorted
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float32)


def test_grpo_divides_by_group_std_and_broadcasts_to_tokens():
    a, b = 0.5 / (0.7071068 + 1e-6), 1 / (1.7320508 + 1e-6)
    expected = torch.tensor([a, -a, -b, -b, 2 * b])
    assert torch.allclose(group_normalized(REWARDS, GROUPS, divide_by_std=True), expected, atol=1e-6)
    advantages, returns = compute_advantages("grpo", REWARDS, GROUPS, MASK)
    assert returns is None
    assert torch.allclose(advantages, expected[:, None] * MASK, atol=1e-6)
    assert torch.equal(compute_advantages("gspo", REWARDS, GROUPS, MASK)[0], advantages)


def test_dr_grpo_only_subtracts_the_group_mean():
    advantages, _ = compute_advantages("dr_grpo", REWARDS, GROUPS, MASK)
    assert torch.allclose(advantages[:, 0], torch.tensor([0.5, -0.5, -1.0, -1.0, 2.0]))


def test_without_rewards_normalization_the_group_estimators_take_the_raw_reward():
    # --disable-rewards-normalization (slime's flag): no group mean, no std; a failed sample still gets 0
    valid = torch.tensor([True, True, True, False, True])
    for estimator in ("grpo", "dr_grpo", "gspo", "cispo"):
        advantages, _ = compute_advantages(estimator, REWARDS, GROUPS, MASK, valid=valid, group_baseline=False)
        assert torch.equal(advantages, torch.tensor([1.0, 0.0, 2.0, 0.0, 5.0])[:, None] * MASK), estimator
    # reinforce_plus_plus_baseline: raw rewards on every trained token, then whitened over the batch's 8 such
    # tokens of the valid samples: values 1 1 0 2 2 2 5 5 (sample 3 left out), mean 18/8 = 2.25
    advantages, _ = compute_advantages("reinforce_plus_plus_baseline", REWARDS, GROUPS, MASK, valid=valid,
                                       group_baseline=False)
    tokens = torch.tensor([1.0, 1.0, 0.0, 2.0, 2.0, 2.0, 5.0, 5.0])
    std = math.sqrt(((tokens - 2.25) ** 2).sum().item() / 7)
    assert torch.allclose(advantages[0, 0], torch.tensor((1.0 - 2.25) / std), atol=1e-5)
    assert torch.allclose(advantages[4, 0], torch.tensor((5.0 - 2.25) / std), atol=1e-5)
    assert torch.all(advantages[3] == 0)


def test_rewards_normalization_off_is_refused_where_no_group_reward_is_normalized():
    with pytest.raises(Exception, match="--disable-rewards-normalization applies to"):
        build(AlgorithmConfig, advantage_estimator="rloo", disable_rewards_normalization=True)


def test_rloo_uses_the_mean_of_the_other_samples():
    # group 1: 2 - (2+5)/2 = -1.5, again -1.5, 5 - (2+2)/2 = 3; group 0: 1 - 0 = 1, 0 - 1 = -1
    assert torch.allclose(leave_one_out(REWARDS, GROUPS), torch.tensor([1.0, -1.0, -1.5, -1.5, 3.0]))


def test_a_group_of_one_has_no_baseline():
    single = torch.tensor([0.7])
    assert torch.allclose(group_normalized(single, torch.tensor([0]), divide_by_std=True), single)
    assert torch.allclose(leave_one_out(single, torch.tensor([0])), single)


def test_masked_whiten_uses_masked_entries_and_unbiased_variance():
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # entries 1, 2, 3: mean 2, var (1 + 0 + 1) / 2 = 1
    assert torch.allclose(masked_whiten(values, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="whiten"):
        masked_whiten(values, torch.tensor([[1.0, 0, 0], [0, 0, 0]]))


def test_discounted_returns_skip_tool_tokens():
    rewards = torch.tensor([[0.0, 5.0, 1.0]])  # the 5 sits on a masked (tool) token: ignored
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    # G2 = 1; the tool token is not a time step; G0 = 0 + 0.5 * 1
    assert torch.allclose(discounted_returns(rewards, mask, 0.5), torch.tensor([[0.5, 0.0, 1.0]]))


def test_reinforce_plus_plus_kl_in_reward_discount_and_batch_whitening():
    rewards = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.2, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # token rewards (kl_coef 0.5): seq0 -0.05, -0.1, -0.15 + 1 = 0.85; seq1 -0.1, 0 (reward 0 on its last token)
    # gamma 0.5 returns: seq0 G2 = 0.85, G1 = -0.1 + 0.425 = 0.325, G0 = -0.05 + 0.1625 = 0.1125
    #                    seq1 G1 = 0, G0 = -0.1
    returns = [0.1125, 0.325, 0.85, -0.1, 0.0]
    mean = sum(returns) / 5
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 4 + 1e-8)
    w = [(r - mean) / std for r in returns]
    expected = torch.tensor([[w[0], w[1], w[2]], [w[3], w[4], 0.0]])
    advantages, _ = compute_advantages("reinforce_plus_plus", rewards, torch.tensor([0, 1]), mask, kl=kl,
                                       kl_coef=0.5, gamma=0.5)
    assert torch.allclose(advantages, expected, atol=1e-5)


def test_reinforce_plus_plus_baseline_centres_on_the_group_then_whitens():
    rewards = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.2, 0.4], [0.0, 0.2]])
    mask = torch.ones(2, 2)
    # group mean 0.5: 0.5 and -0.5 per token, minus 0.5 * kl -> 0.4, 0.3, -0.5, -0.6
    raw = [0.4, 0.3, -0.5, -0.6]
    mean = sum(raw) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in raw) / 3 + 1e-8)
    expected = torch.tensor([[(r - mean) / std for r in raw[:2]], [(r - mean) / std for r in raw[2:]]])
    advantages, _ = compute_advantages("reinforce_plus_plus_baseline", rewards, torch.tensor([4, 4]), mask, kl=kl,
                                       kl_coef=0.5)
    assert torch.allclose(advantages, expected, atol=1e-5)


def test_gae_by_hand():
    values = torch.tensor([[0.5, 0.2, 0.1]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    # gamma 1, lambda 0.5: delta2 = 1 - 0.1 = 0.9 -> A2 0.9; delta1 = 0.1 - 0.2 -> A1 = -0.1 + 0.45 = 0.35;
    # delta0 = 0.2 - 0.5 -> A0 = -0.3 + 0.175 = -0.125; returns = A + V
    advantages, returns = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.5)
    assert torch.allclose(advantages, torch.tensor([[-0.125, 0.35, 0.9]]))
    assert torch.allclose(returns, torch.tensor([[0.375, 0.55, 1.0]]))
    # a tool token in the middle is skipped: V_next of step 0 is step 2's value
    advantages, _ = gae(rewards, torch.tensor([[0.5, 9.0, 0.1]]), torch.tensor([[1.0, 0.0, 1.0]]), 1.0, 0.5)
    assert torch.allclose(advantages, torch.tensor([[-0.4 + 0.45, 0.0, 0.9]]))


def test_ppo_puts_the_reward_on_the_last_policy_token_with_kl_penalty():
    values = torch.zeros(1, 3)
    kl = torch.tensor([[0.2, 0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # token rewards: -0.1, -0.1 + 1 = 0.9 (last masked token); gamma = lambda = 1, V = 0 -> A = suffix sums
    advantages, returns = compute_advantages("ppo", torch.tensor([1.0]), torch.tensor([0]), mask, kl=kl, kl_coef=0.5,
                                             values=values)
    assert torch.allclose(advantages, torch.tensor([[0.8, 0.9, 0.0]]))
    assert torch.allclose(returns, advantages)


def test_normalize_advantages_whitens_and_kl_coef_is_refused_for_group_estimators():
    advantages, _ = compute_advantages("dr_grpo", REWARDS, GROUPS, MASK, normalize=True)
    trained = advantages[MASK > 0]
    assert abs(float(trained.mean())) < 1e-6 and abs(float(trained.std()) - 1) < 1e-4
    with pytest.raises(ValueError, match="--kl-loss-coef"):
        compute_advantages("grpo", REWARDS, GROUPS, MASK, kl=torch.zeros_like(MASK), kl_coef=0.1)
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("ppo", REWARDS, GROUPS, MASK)


# ---------------------------------------------------------------- FAILED samples are not data
# group 5: rewards 1, 0, FAILED, 1 -> the three valid members are the group [1, 0, 1]:
#   mean 2/3, deviations 1/3, -2/3, 1/3, unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3, std 0.5773503
#   leave-one-out: 1 - (0 + 1)/2 = 0.5, 0 - (1 + 1)/2 = -1, 0.5
# group 2: rewards 3, 1 (no failure): mean 2, std sqrt(2) = 1.4142136, leave-one-out 2, -2
F_REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])  # the FAILED sample's stored reward is 0
F_GROUPS = torch.tensor([5, 5, 5, 5, 2, 2])
F_VALID = torch.tensor([True, True, False, True, True, True])
F_MASK = torch.ones(6, 2)  # the failed row's mask is left 1 on purpose: `valid` alone must exclude it
THIRD, STD3, STD2 = 1 / 3, 0.5773503, 1.4142136


@pytest.mark.parametrize("estimator, expected", [
    ("grpo", [THIRD / (STD3 + 1e-6), -2 * THIRD / (STD3 + 1e-6), 0.0, THIRD / (STD3 + 1e-6),
              1 / (STD2 + 1e-6), -1 / (STD2 + 1e-6)]),
    ("gspo", [THIRD / (STD3 + 1e-6), -2 * THIRD / (STD3 + 1e-6), 0.0, THIRD / (STD3 + 1e-6),
              1 / (STD2 + 1e-6), -1 / (STD2 + 1e-6)]),
    ("cispo", [THIRD / (STD3 + 1e-6), -2 * THIRD / (STD3 + 1e-6), 0.0, THIRD / (STD3 + 1e-6),
               1 / (STD2 + 1e-6), -1 / (STD2 + 1e-6)]),
    ("dr_grpo", [THIRD, -2 * THIRD, 0.0, THIRD, 1.0, -1.0]),
    ("rloo", [0.5, -1.0, 0.0, 0.5, 2.0, -2.0]),
])
def test_a_failed_member_is_left_out_of_its_group(estimator, expected):
    advantages, _ = compute_advantages(estimator, F_REWARDS, F_GROUPS, F_MASK, valid=F_VALID)
    assert torch.allclose(advantages, torch.tensor(expected)[:, None].expand(6, 2), atol=1e-6)
    # the same as the batch without the failed sample, whatever reward it carries (even NaN)
    keep = F_VALID.nonzero().squeeze(-1)
    without, _ = compute_advantages(estimator, F_REWARDS[keep], F_GROUPS[keep], F_MASK[keep])
    nan_reward = F_REWARDS.clone()
    nan_reward[2] = float("nan")
    with_nan, _ = compute_advantages(estimator, nan_reward, F_GROUPS, F_MASK, valid=F_VALID)
    assert torch.allclose(advantages[keep], without, atol=1e-6) and torch.equal(with_nan, advantages)


def test_a_group_with_one_valid_member_has_no_baseline_and_one_with_none_trains_nothing():
    rewards, groups = torch.tensor([0.7, 0.0, 0.4, 0.0]), torch.tensor([0, 0, 1, 1])
    valid = torch.tensor([True, False, False, False])  # group 0: one valid member; group 1: none
    # one member: mean 0, std 1 -> A = r (GRPO: r / (1 + eps)); no member: 0
    assert torch.allclose(group_normalized(rewards, groups, divide_by_std=True, valid=valid),
                          torch.tensor([0.7 / (1 + 1e-6), 0, 0, 0]))
    assert torch.allclose(group_normalized(rewards, groups, divide_by_std=False, valid=valid),
                          torch.tensor([0.7, 0, 0, 0]))
    assert torch.allclose(leave_one_out(rewards, groups, valid), torch.tensor([0.7, 0, 0, 0]))


def test_reinforce_plus_plus_baseline_centres_on_the_valid_members_and_whitens_over_them():
    # group 0: 1, 0, FAILED -> mean 0.5 (with the failed 0 it would be 1/3); group 1: 1, 0 -> mean 0.5
    # centred (kl 0): 0.5, -0.5, -, 0.5, -0.5 -> whitened over 4 tokens: mean 0, var 4 * 0.25 / 3 = 1/3
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1, 1])
    valid = torch.tensor([True, True, False, True, True])
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    advantages, _ = compute_advantages("reinforce_plus_plus_baseline", rewards, groups, torch.ones(5, 1),
                                       valid=valid)
    assert torch.allclose(advantages[:, 0], torch.tensor([a, -a, 0.0, a, -a]), atol=1e-5)


def test_token_level_estimators_give_a_failed_sample_nothing_and_whiten_without_it():
    rewards, groups = torch.tensor([1.0, 0.0, 5.0]), torch.tensor([0, 1, 2])
    valid = torch.tensor([True, True, False])
    mask = torch.ones(3, 2)
    # REINFORCE++ (gamma 1, no kl): returns 1, 1 | 0, 0 -> mean 0.5, var 4 * 0.25 / 3 = 1/3
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    advantages, _ = compute_advantages("reinforce_plus_plus", rewards, groups, mask, valid=valid)
    assert torch.allclose(advantages, torch.tensor([[a, a], [-a, -a], [0.0, 0.0]]), atol=1e-5)
    # PPO with V = 0.5 everywhere: the failed row has no advantage and no return for the critic
    advantages, returns = compute_advantages("ppo", rewards, groups, mask, valid=valid, values=torch.full((3, 2), 0.5))
    assert advantages[2].abs().sum() == 0 and returns[2].abs().sum() == 0
    assert torch.allclose(advantages[0], torch.tensor([0.5, 0.5])) and torch.allclose(returns[0], torch.ones(2))
    # --normalize-advantages whitens over the valid tokens only: dr_grpo on singletons is r -> same as above
    advantages, _ = compute_advantages("dr_grpo", rewards, groups, mask, valid=valid, normalize=True)
    assert torch.allclose(advantages, torch.tensor([[a, a], [-a, -a], [0.0, 0.0]]), atol=1e-5)


def test_opo_subtracts_the_length_weighted_mean_reward_of_the_group():
    """OPO (Hao et al. 2025): b = sum_i l_i R_i / sum_i l_i, A_i = R_i - b, l_i the response's trained tokens.
    group 0: rewards 1, 0, 1 with lengths 2, 4, 1: b = (2 + 0 + 1) / 7 = 3/7 -> 4/7, -3/7, 4/7
    group 1: rewards 0, 1 (FAILED, left out), 1 with lengths 3, 2, 1: b = (0 + 1) / 4 -> -1/4, 0, 3/4
    group 2: a single sequence: no baseline, A = r"""
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.6])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    lengths = [2, 4, 1, 3, 2, 1, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lengths])
    valid = torch.tensor([True, True, True, True, False, True, True])
    advantages, returns = compute_advantages("opo", rewards, groups, mask, valid=valid)
    expected = torch.tensor([4 / 7, -3 / 7, 4 / 7, -1 / 4, 0.0, 3 / 4, 0.6])
    assert returns is None
    assert torch.allclose(advantages, expected[:, None] * mask * valid[:, None], atol=1e-6)


def _pass_at_k_by_enumeration(rewards: list[float], k: int) -> list[float]:
    """Each sample's advantage averaged over every k-subset of its group that holds it, the subset's
    reward max(rewards) normalised by the mean and std of the subset rewards over all k-subsets."""
    subsets = list(itertools.combinations(range(len(rewards)), k))
    value = {s: max(rewards[i] for i in s) for s in subsets}
    mean = sum(value.values()) / len(subsets)
    std = math.sqrt(sum((v - mean) ** 2 for v in value.values()) / len(subsets))
    return [sum((value[s] - mean) / (std + 1e-6) for s in subsets if i in s) / sum(1 for s in subsets if i in s)
            for i in range(len(rewards))]


def test_pass_at_k_analytical_advantages():
    """Pass@k Training (arXiv 2508.10751), n = 4, c = 1, k = 2: R = 1 - C(3, 2) / C(4, 2) = 1/2,
    std = sqrt(R (1 - R)) = 1/2; A_pos = (1 - R) / std = 1; A_neg = (1 - R - C(2, 1) / C(3, 1)) / std = -1/3.
    A second group n = 5, c = 2, k = 3 is checked against the enumeration of its k-subsets, and a third,
    all correct, has pass@k 1 and nothing to learn."""
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
    mask = torch.ones(11, 2)
    advantages, _ = compute_advantages("pass_at_k", rewards, groups, mask, pass_k=2)
    assert advantages[:4, 0].tolist() == pytest.approx([-1 / 3, 1.0, -1 / 3, -1 / 3], rel=1e-5)
    assert advantages[9:, 0].tolist() == [0.0, 0.0]
    advantages, _ = compute_advantages("pass_at_k", rewards[4:9], groups[4:9], mask[4:9], pass_k=3)
    assert advantages[:, 0].tolist() == pytest.approx(_pass_at_k_by_enumeration([1.0, 0.0, 1.0, 0.0, 0.0], 3),
                                                      rel=1e-5)


def test_pass_at_k_leaves_failed_samples_out_and_needs_binary_rewards_and_k():
    # n = 4 with one FAILED: the group [1, 0, 0] with k = 2: R = 1 - C(2, 2) / C(3, 2) = 2/3,
    # std = sqrt(2/9); A_pos = (1/3) / std, A_neg = (1 - 2/3 - C(1, 1) / C(2, 1)) / std = (-1/6) / std
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long)
    valid = torch.tensor([True, True, False, True])
    advantages, _ = compute_advantages("pass_at_k", rewards, groups, torch.ones(4, 1), valid=valid, pass_k=2)
    std = math.sqrt(2 / 9)
    assert advantages[:, 0].tolist() == pytest.approx([1 / 3 / std, -1 / 6 / std, 0.0, -1 / 6 / std], rel=1e-5)
    # k larger than the group: pass@n (k = 3 here): R = 1, nothing to learn
    advantages, _ = compute_advantages("pass_at_k", rewards, groups, torch.ones(4, 1), valid=valid, pass_k=8)
    assert advantages.abs().max().item() < 1e-6
    with pytest.raises(ValueError, match="rewards of 0 or 1"):
        compute_advantages("pass_at_k", torch.tensor([0.5, 1.0]), torch.zeros(2, dtype=torch.long),
                           torch.ones(2, 1), pass_k=2)
    with pytest.raises(ValueError, match="--pass-k"):
        compute_advantages("pass_at_k", rewards, groups, torch.ones(4, 1))


def test_pass_at_k_and_its_k_are_configured_together():
    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.algorithms.hooks import AdvantageInputs, builtin_advantages

    with pytest.raises(Exception, match="--advantage-estimator pass_at_k needs --pass-k"):
        build(AlgorithmConfig, advantage_estimator="pass_at_k")
    algo = build(AlgorithmConfig, advantage_estimator="pass_at_k", pass_k=2)
    inputs = AdvantageInputs(rewards=torch.tensor([0.0, 1.0, 0.0, 0.0]), group_ids=torch.zeros(4, dtype=torch.long),
                             mask=torch.ones(4, 1), valid=torch.ones(4, dtype=torch.bool),
                             rollout_log_probs=torch.zeros(4, 1))
    advantages, _ = builtin_advantages(algo, inputs)  # the driver's path passes --pass-k through
    assert advantages[:, 0].tolist() == pytest.approx([-1 / 3, 1.0, -1 / 3, -1 / 3], rel=1e-5)
