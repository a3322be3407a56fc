"""KL estimators, policy / value losses, off-policy weights and aggregation against numbers worked
out by hand."""

import math

import pytest
import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.kl import kl_estimate
from lean_rl.algorithms.losses import (aggregate, aggregation_weights, behaviour_weights, policy_loss, ppo_clip,
                                      rejection_mask, rollout_log_ratio, sequence_ratio, tis_weights, value_loss)
from lean_rl.algorithms.policy_losses import clip_cov_drop, token_covariance
from lean_rl.options import build

LN2 = math.log(2)


@pytest.mark.parametrize("kind, expected", [
    ("k1", LN2),  # logp - ref = log(0.5) - log(0.25)
    ("k2", LN2 ** 2 / 2),
    ("k3", 0.5 - 1 + LN2),  # r = ref / p = 0.5: (r - 1) - log r
    ("low_var_kl", 0.5 - 1 + LN2),
])
def test_kl_estimators(kind, expected):
    value = kl_estimate(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]), kind)
    assert value.item() == pytest.approx(expected, rel=1e-6)


def test_low_var_kl_is_k3_clamped():
    logp, ref = torch.tensor([-20.0]), torch.tensor([0.0])  # log r = ref - logp = 20: k3 = e^20 - 1 - 20
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert kl_estimate(logp, ref, "low_var_kl").item() == 10.0
    with pytest.raises(ValueError, match="--kl-loss-type"):
        kl_estimate(logp, ref, "k4")


@pytest.mark.parametrize("gap", [90.0, -90.0, 1e4, -1e4])
def test_low_var_kl_value_and_gradient_are_finite_for_any_log_ratio(gap):
    """ref - logp = 90: exp(90) overflows float32; without the inner clamp the value is clamped to 10
    but the gradient is inf * 0 = NaN. With it, both are finite (and the gradient is 0 where clamped)."""
    logp = torch.tensor([0.0, -1.0], requires_grad=True)
    ref = torch.tensor([gap, -1.5])
    kl = kl_estimate(logp, ref, "low_var_kl")
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()
    # log r clamped to +-20: k3 = e^20 - 21 or e^-20 + 19, both past the outer bound 10
    assert kl[0].item() == 10.0 and logp.grad[0].item() == 0.0
    # an ordinary token: value k3, gradient d/dlogp [exp(ref - logp) - 1 - (ref - logp)] = 1 - exp(ref - logp)
    assert kl[1].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5, rel=1e-6)
    assert logp.grad[1].item() == pytest.approx(1 - math.exp(-0.5), rel=1e-6)


def test_k3_is_slimes_unclamped_estimator():
    assert kl_estimate(torch.tensor([0.0]), torch.tensor([90.0]), "k3").item() == math.inf  # the overflow


def test_ppo_clip_and_dual_clip():
    ratio = torch.tensor([1.5, 1.5, 0.5, 1.0])
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0])
    loss, clipped = ppo_clip(ratio, adv, eps_clip=0.2, eps_clip_high=0.2)
    # A=1 r=1.5: max(-1.5, -1.2) = -1.2 (clipped); A=-1 r=1.5: max(1.5, 1.2) = 1.5;
    # A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped); A=2 r=1: -2
    assert torch.allclose(loss, torch.tensor([-1.2, 1.5, 0.8, -2.0]))
    assert clipped.tolist() == [1.0, 0.0, 1.0, 0.0]
    loss, _ = ppo_clip(ratio, adv, eps_clip=0.2, eps_clip_high=0.3, eps_clip_c=1.4)
    # upper clip 1.3 for A>0; dual clip caps A<0 losses at -1.4 * A = 1.4
    assert torch.allclose(loss, torch.tensor([-1.3, 1.4, 0.8, -2.0]))


def test_gspo_ratio_is_the_geometric_mean_and_flows_through_every_token():
    logp = torch.tensor([[math.log(1.2), math.log(0.8), 5.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ratio = sequence_ratio(logp, old, mask)
    assert torch.allclose(ratio[0, :2], torch.full((2,), math.sqrt(1.2 * 0.8)))
    (ratio * mask).sum().backward()
    # d r_seq_token / d logp_t = r_seq for each masked token
    assert torch.allclose(logp.grad[0, :2], torch.full((2,), math.sqrt(0.96)))


def test_tis_and_behaviour_weights():
    old = torch.log(torch.tensor([3.0, 0.5, 1.0]))
    rollout = torch.zeros(3)
    weights, capped = tis_weights(old, rollout, clip=2.0)
    assert torch.allclose(weights, torch.tensor([2.0, 0.5, 1.0])) and capped.tolist() == [1.0, 0.0, 0.0]
    weights, capped = tis_weights(old, rollout, clip=2.0, clip_low=0.8)
    assert torch.allclose(weights, torch.tensor([2.0, 0.8, 1.0])) and capped.tolist() == [1.0, 1.0, 0.0]
    weights, dropped = behaviour_weights(old, rollout, cap=2.0)
    assert torch.allclose(weights, torch.tensor([0.0, 0.5, 1.0])) and dropped.tolist() == [1.0, 0.0, 0.0]


VALUES = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0], [99.0, 99.0, 99.0, 99.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # row 3: a FAILED sample


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 3 + 4) / 4),
    ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),
    ("seq-mean-token-sum", (6 + 4) / 2),
    ("seq-mean-token-sum-norm", (6 / 4 + 4 / 4) / 2),  # norm length 4
])
def test_aggregation_modes(mode, expected):
    assert aggregate(VALUES, MASK, mode, norm_length=4).item() == pytest.approx(expected)
    # weights over a whole step == the aggregate, however the rows are later split
    weights = aggregation_weights(MASK, mode, norm_length=4)
    split = (weights[:1] * VALUES[:1]).sum() + (weights[1:] * VALUES[1:]).sum()
    assert split.item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_trajectory_split_into_samples_of_weight_one_half_weighs_one_sequence(mode):
    # rows 0 and 1 are one trajectory's two samples (weight 1/2 each), row 2 another trajectory's one sample
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    values = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    weights = aggregation_weights(mask, mode, sample_weights=torch.tensor([0.5, 0.5, 1.0]))
    got = (weights * values).sum().item()
    expected = {"token-mean": (0.5 * 4 + 0.5 * 5 + 6) / (0.5 * 2 + 0.5 * 1 + 3),
                "seq-mean-token-mean": (0.5 * 2 + 0.5 * 5 + 2) / 2,
                "seq-mean-token-sum": (0.5 * 4 + 0.5 * 5 + 6) / 2}[mode]
    assert got == pytest.approx(expected)
    # weight 1 everywhere is the unweighted aggregation
    ones = aggregation_weights(mask, mode, sample_weights=torch.ones(3))
    assert torch.allclose(ones, aggregation_weights(mask, mode))


def test_aggregation_errors_name_the_flag():
    with pytest.raises(ValueError, match="--loss-norm-length"):
        aggregation_weights(MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="--loss-agg-mode"):
        aggregation_weights(MASK, "sum")


def test_value_loss_clips_around_the_old_value():
    loss, clipped = value_loss(torch.tensor([1.5, 1.9]), torch.tensor([1.0, 1.8]), torch.tensor([2.0, 2.0]), 0.2)
    # v=1.5: (1.5-2)^2 = 0.25 vs clipped v 1.2: 0.64 -> 0.32;  v=1.9: 0.01 vs clipped 1.9 (inside) -> 0.005
    assert torch.allclose(loss, torch.tensor([0.32, 0.005])) and clipped.tolist() == [1.0, 0.0]


def _inputs():
    log_probs = torch.log(torch.tensor([[0.5, 0.4]])).requires_grad_()
    return dict(log_probs=log_probs, advantages=torch.tensor([[1.0, -1.0]]), mask=torch.ones(1, 2),
                weights=torch.full((1, 2), 0.5), metric_weights=torch.full((1, 2), 0.5))


def test_policy_loss_total_with_kl_and_entropy_terms():
    cfg = build(AlgorithmConfig, kl_loss_coef=0.1, kl_loss_type="k1", entropy_coef=0.01)
    inputs = _inputs()
    old = torch.log(torch.tensor([[0.25, 0.4]]))  # ratios 2.0 and 1.0
    ref = torch.log(torch.tensor([[0.25, 0.8]]))  # k1 = ln 2 and -ln 2
    entropy = torch.tensor([[1.0, 3.0]])
    loss, metrics = policy_loss(cfg, old_log_probs=old, ref_log_probs=ref, entropy=entropy, **inputs)
    # pg: token 1 A=1 r=2 -> -1.2 (clipped); token 2 A=-1 r=1 -> 1.0;  kl: 0.1*(ln2) and 0.1*(-ln2)
    # entropy: -0.01*1, -0.01*3;  loss = 0.5 * sum
    expected = 0.5 * ((-1.2 + 0.1 * LN2 - 0.01) + (1.0 - 0.1 * LN2 - 0.03))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["pg_loss"].item() == pytest.approx(0.5 * (-1.2 + 1.0))
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["kl_loss"].item() == pytest.approx(0.0, abs=1e-7)
    assert metrics["entropy"].item() == pytest.approx(2.0)


def test_policy_loss_without_old_log_probs_is_on_policy():
    inputs = _inputs()
    loss, metrics = policy_loss(build(AlgorithmConfig), **inputs)
    assert loss.item() == pytest.approx(0.5 * (-1.0 + 1.0))  # ratio 1: -A
    loss.backward()
    # d/dlogp of -A * exp(logp - sg(logp)) at ratio 1 = -A, times weight 0.5
    assert torch.allclose(inputs["log_probs"].grad, torch.tensor([[-0.5, 0.5]]))
    assert metrics["ppo_kl"].item() == 0.0


def test_tis_scales_the_policy_gradient_term():
    inputs = _inputs()
    rollout = torch.log(torch.tensor([[0.1, 0.8]]))  # old = current: weights min(5, 2) = 2 and 0.5
    loss, metrics = policy_loss(build(AlgorithmConfig, use_tis=True, tis_clip=2.0), rollout_log_probs=rollout, **inputs)
    assert loss.item() == pytest.approx(0.5 * (-1.0 * 2.0 + 1.0 * 0.5))
    assert metrics["tis_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["tis_weight"].item() == pytest.approx(0.5 * (2.0 + 0.5))


def test_decoupled_ppo_clips_against_the_proximal_policy_and_weights_by_behaviour():
    inputs = _inputs()
    prox = torch.log(torch.tensor([[0.25, 0.4]]))  # ratio vs proximal: 2.0 (clipped to 1.2), 1.0
    behav = torch.log(torch.tensor([[0.125, 0.1]]))  # exp(prox - behav) = 2.0, 4.0 (above cap 3: dropped)
    cfg = build(AlgorithmConfig, decoupled_ppo=True, behav_imp_weight_cap=3.0)
    loss, metrics = policy_loss(cfg, old_log_probs=prox, rollout_log_probs=behav, **inputs)
    assert loss.item() == pytest.approx(0.5 * (-1.2 * 2.0 + 1.0 * 0.0))
    assert metrics["behav_dropped_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="proximal"):
        policy_loss(cfg, rollout_log_probs=behav, **_inputs())


def test_gspo_policy_loss_uses_the_sequence_ratio():
    inputs = _inputs()
    old = torch.log(torch.tensor([[0.25, 0.4]]))  # token ratios 2 and 1 -> sequence ratio sqrt(2) = 1.414
    loss, _ = policy_loss(build(AlgorithmConfig, advantage_estimator="gspo", eps_clip=0.5), old_log_probs=old, **inputs)
    r = math.sqrt(2)
    # token 1: A=1: max(-r, -1.414 clipped to 1.5 -> -r) = -r; token 2: A=-1: max(r, r) = r
    assert loss.item() == pytest.approx(0.5 * (-r + r), abs=1e-6)


def _two_rows():
    """Two sequences of 3 tokens (the last token of row 1 not trained); train and rollout log-probs
    chosen so the token ratios pi_train / pi_rollout are row 0: 2, 1, 0.5 and row 1: 4, 4, (masked)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.log(torch.tensor([[0.4, 0.3, 0.2], [0.4, 0.4, 0.9]]))
    rollout = torch.log(torch.tensor([[0.2, 0.3, 0.4], [0.1, 0.1, 0.1]]))
    return old, rollout, mask


@pytest.mark.parametrize("level, row0, row1", [
    ("token", [2.0, 1.0, 0.5], [4.0, 4.0]),
    ("sequence", [1.0] * 3, [16.0] * 2),                    # product of the trained tokens' ratios
    ("geometric", [1.0] * 3, [4.0] * 2),                    # (prod)^(1 / number of trained tokens)
])
def test_importance_ratio_levels(level, row0, row1):
    old, rollout, mask = _two_rows()
    ratio = torch.exp(rollout_log_ratio(old, rollout, mask, level))
    assert ratio[0].tolist() == pytest.approx(row0, rel=1e-5)
    assert ratio[1, :2].tolist() == pytest.approx(row1, rel=1e-5)


def test_truncated_is_at_the_sequence_level():
    old, rollout, mask = _two_rows()
    weights, bounded = tis_weights(old, rollout, clip=2.0, clip_low=0.5, mask=mask, level="sequence")
    assert weights[0].tolist() == pytest.approx([1.0] * 3) and weights[1, :2].tolist() == pytest.approx([2.0] * 2)
    assert bounded[:, :2].tolist() == [[0.0, 0.0], [1.0, 1.0]]


@pytest.mark.parametrize("level, kept", [
    ("token", [[0, 1, 0], [0, 0]]),      # 2 and 4 are above 1.5, 0.5 below 1/1.5
    ("geometric", [[1, 1, 1], [0, 0]]),  # row 0's geometric mean is 1: the whole row stays
])
def test_rejection_sampling_masks_tokens_or_whole_sequences(level, kept):
    old, rollout, mask = _two_rows()
    keep = rejection_mask(old, rollout, mask, lower=1 / 1.5, upper=1.5, level=level)
    assert keep[0].tolist() == kept[0] and keep[1, :2].tolist() == kept[1]


def test_policy_loss_rejects_and_logs_the_mismatch_every_step():
    old, rollout, mask = _two_rows()
    log_probs = old.clone().requires_grad_()
    inputs = dict(log_probs=log_probs, advantages=torch.ones(2, 3), mask=mask, weights=mask / 5,
                  metric_weights=mask / 5)
    loss, metrics = policy_loss(build(AlgorithmConfig, use_rs=True, rs_upper_bound=1.5), rollout_log_probs=rollout, **inputs)
    assert loss.item() == pytest.approx(-1 / 5)  # ratio 1 (on policy), A = 1: only the one kept token counts
    assert metrics["rs_masked_frac"].item() == pytest.approx(4 / 5)
    deltas = [math.log(2), 0.0, math.log(0.5), math.log(4), math.log(4)]
    assert metrics["rollout_logprob_abs_diff"].item() == pytest.approx(sum(map(abs, deltas)) / 5, rel=1e-5)
    # KL(rollout || train) by k3 with r = pi_train / pi_rollout: (r - 1) - log r
    assert metrics["mismatch_kl"].item() == pytest.approx(sum(math.exp(d) - 1 - d for d in deltas) / 5, rel=1e-5)
    _, plain = policy_loss(build(AlgorithmConfig), rollout_log_probs=rollout, **inputs)
    assert "rs_masked_frac" not in plain and plain["rollout_logprob_abs_diff"] == metrics["rollout_logprob_abs_diff"]


def test_rejection_bounds_are_checked():
    assert build(AlgorithmConfig, use_rs=True, rs_upper_bound=4.0).rs_lower_bound == 0.25
    with pytest.raises(Exception, match="--rs-lower-bound"):
        build(AlgorithmConfig, use_rs=True, rs_lower_bound=3.0, rs_upper_bound=2.0)


# --- CISPO, GMPO, KL-Cov, Clip-Cov (lean_rl/algorithms/policy_losses.py) ---

def _three_tokens():
    """One row of 3 trained tokens; ratios pi / pi_old = 2, 1, 0.5; advantages 1, -1, -1; token-mean weights."""
    log_probs = torch.log(torch.tensor([[0.5, 0.4, 0.3]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.4, 0.6]]))
    return dict(log_probs=log_probs, old_log_probs=old, advantages=torch.tensor([[1.0, -1.0, -1.0]]),
                mask=torch.ones(1, 3), weights=torch.full((1, 3), 1 / 3), metric_weights=torch.full((1, 3), 1 / 3))


@pytest.mark.parametrize("cfg", [build(AlgorithmConfig, advantage_estimator="cispo"), build(AlgorithmConfig, policy_loss="cispo")])
def test_cispo_detaches_the_clipped_weight_and_keeps_every_tokens_gradient(cfg):
    """MiniMax-M1 eq. (4): J = E[ sum_t sg(r^_t) A_t log pi(t) ], r^_t = clip(r_t, 1 - eps_low, 1 + eps_high)."""
    inputs = _three_tokens()
    loss, metrics = policy_loss(cfg, **inputs)
    w = [1.2, 1.0, 0.8]  # clip(2, 0.8, 1.2), 1, clip(0.5, 0.8, 1.2)
    adv = [1.0, -1.0, -1.0]
    logp = [math.log(0.5), math.log(0.4), math.log(0.3)]
    assert loss.item() == pytest.approx(sum(-w[t] * adv[t] * logp[t] for t in range(3)) / 3, rel=1e-6)
    loss.backward()
    # d/dlogp_t = -w_t A_t / 3: tokens 1 and 3 are the ones PPO clips (zero gradient there), CISPO keeps them
    assert inputs["log_probs"].grad[0].tolist() == pytest.approx([-w[t] * adv[t] / 3 for t in range(3)], rel=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)


def test_cispo_may_drop_the_lower_bound_and_other_losses_keep_eps_clip_below_one():
    assert build(AlgorithmConfig, advantage_estimator="cispo", eps_clip=1.0, eps_clip_high=4.0).policy_loss == "cispo"
    with pytest.raises(Exception, match="--eps-clip must be in"):
        build(AlgorithmConfig, eps_clip=1.0)
    with pytest.raises(Exception, match="--advantage-estimator gspo uses --policy-loss gspo"):
        build(AlgorithmConfig, advantage_estimator="gspo", policy_loss="cispo")
    with pytest.raises(Exception, match="--eps-clip-c"):
        build(AlgorithmConfig, policy_loss="gmpo", eps_clip_c=3.0)
    assert build(AlgorithmConfig).policy_loss == "ppo" and build(AlgorithmConfig, advantage_estimator="gspo").policy_loss == "gspo"


def test_gmpo_geometric_mean_of_sign_aware_clipped_token_ratios():
    """GMPO (arXiv 2507.20673) eq. (6), eps = 0.4 in log space:
    J = 1/G sum_i { prod_t min(r_t A_i, clip(r_t, e^-eps, e^eps) A_i)^(1/|o_i|) } sign(A_i)
      = 1/G sum_i A_i (prod_t min / max(r_t, clip(r_t)))^(1/|o_i|)   (min for A > 0, max for A < 0)"""
    cfg = build(AlgorithmConfig, policy_loss="gmpo", eps_clip=0.4, eps_clip_high=0.4)
    assert cfg.aggregation == "seq-mean-token-mean"
    log_ratio = torch.tensor([[0.5, 0.1, -0.6], [0.5, -0.6, 3.0]])  # row 1's last token is not trained
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.full((2, 3), -2.0)
    log_probs = (old + log_ratio).requires_grad_()
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
    weights = aggregation_weights(mask, cfg.aggregation)
    loss, metrics = policy_loss(cfg, log_probs=log_probs, old_log_probs=old, advantages=advantages, mask=mask,
                                weights=weights, metric_weights=weights)
    e = math.exp
    # A = +1: min(r, clip r) = e^0.4 (clipped), e^0.1, e^-0.6 (below the band: min keeps r)
    rho0 = (min(e(0.5), e(0.4)) * e(0.1) * min(e(-0.6), e(-0.4))) ** (1 / 3)
    # A = -1: max(r, clip r) = e^0.5 (above the band: max keeps r), e^-0.4 (clipped)
    rho1 = (max(e(0.5), e(0.4)) * max(e(-0.6), e(-0.4))) ** (1 / 2)
    assert loss.item() == pytest.approx((1 * -rho0 + -1 * -rho1) / 2, rel=1e-5)
    loss.backward()
    # d(-A_i rho_i / G)/dlogp_t = -A_i rho_i / (G |o_i|) where token t is not clipped, else 0
    expected = [[0.0, -rho0 / 6, -rho0 / 6], [rho1 / 4, 0.0, 0.0]]
    assert log_probs.grad.tolist()[0] == pytest.approx(expected[0], rel=1e-5, abs=1e-7)
    assert log_probs.grad.tolist()[1] == pytest.approx(expected[1], rel=1e-5, abs=1e-7)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 2 * 1 / 3 + 1 / 2 * 1 / 2)


# 2 x 2 trained tokens (+ one untrained column that must not move the means):
# mean logp = (-1 - 2 - 3 - 0.5) / 4 = -1.625, mean A = 0
# cov = (logp + 1.625) * A = [[0.625, -0.375], [-1.375 * -1 = 1.375, 1.125 * -1 = -1.125]]
COV_LOGP = [[-1.0, -2.0, -100.0], [-3.0, -0.5, -100.0]]
COV_ADV = torch.tensor([[1.0, 1.0, 50.0], [-1.0, -1.0, 50.0]])
COV_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
COV_LOG_RATIO = torch.tensor([[0.1, 0.2, 0.0], [-0.3, 0.0, 0.0]])  # ratios e^0.1, e^0.2, e^-0.3, 1


def _cov_inputs():
    log_probs = torch.tensor(COV_LOGP).requires_grad_()
    return dict(log_probs=log_probs, old_log_probs=log_probs.detach() - COV_LOG_RATIO, advantages=COV_ADV,
                mask=COV_MASK, weights=COV_MASK / 4, metric_weights=COV_MASK / 4)


def test_token_covariance_over_the_trained_tokens():
    cov = token_covariance(torch.tensor(COV_LOGP), COV_ADV, COV_MASK)
    assert cov.flatten().tolist() == pytest.approx([0.625, -0.375, 0.0, 1.375, -1.125, 0.0])


def test_kl_cov_penalises_the_top_covariance_tokens_without_ratio_clipping():
    """Cui et al. (arXiv 2505.22617) eq. (11): L = -A_t r_t, plus k |log pi_t - log pi_old_t| for t in the
    top-k fraction by covariance; here k = max(1, int(0.25 * 4)) = 1 token: (1, 0), cov 1.375."""
    inputs = _cov_inputs()
    loss, metrics = policy_loss(build(AlgorithmConfig, policy_loss="kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=2.0), **inputs)
    e = math.exp
    # -A r: -e^0.1, -e^0.2 (PPO would clip it to -1.2), +e^-0.3 plus 2 * 0.3, +1
    assert loss.item() == pytest.approx((-e(0.1) - e(0.2) + e(-0.3) + 2 * 0.3 + 1) / 4, abs=1e-6)
    loss.backward()
    # d/dlogp: -A r (+ 2 * sign(log r) on the penalised token), / 4
    grad = inputs["log_probs"].grad
    assert grad[:, :2].flatten().tolist() == pytest.approx([-e(0.1) / 4, -e(0.2) / 4, (e(-0.3) - 2) / 4, 1 / 4], rel=1e-5)
    assert metrics["kl_cov_frac"].item() == pytest.approx(1 / 4)


def test_clip_cov_takes_the_gradient_from_unclipped_tokens_in_the_covariance_band():
    """Cui et al. Clip-Cov: candidates have clip_cov_lb < cov < clip_cov_ub and were not clipped by PPO;
    with lb 0.5: (0, 0) (cov 0.625) and (1, 0) (cov 1.375, but PPO clipped it: A = -1, r = e^-0.3 < 0.8)."""
    inputs = _cov_inputs()
    cfg = build(AlgorithmConfig, policy_loss="clip_cov", clip_cov_ratio=0.25, clip_cov_lb=0.5, clip_cov_ub=5.0)
    loss, metrics = policy_loss(cfg, **inputs)
    e = math.exp
    # the value is PPO's: -e^0.1, -1.2 (clipped), max(e^-0.3, 0.8) = 0.8 (clipped), 1
    assert loss.item() == pytest.approx((-e(0.1) - 1.2 + 0.8 + 1) / 4, rel=1e-6)
    loss.backward()
    # gradient only from (1, 1): -A r / 4 = 1/4; (0, 0) by Clip-Cov, (0, 1) and (1, 0) by PPO's clip
    assert inputs["log_probs"].grad[:, :2].flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, 0.25])
    assert metrics["clip_cov_frac"].item() == pytest.approx(1 / 4)


def test_clip_cov_draws_a_deterministic_bounded_subset_of_the_candidates():
    cov = torch.tensor([[2.0, 3.0, 0.5, 4.0], [2.5, 9.0, 1.5, 3.5]])  # band (1, 5): 6 candidates
    mask = torch.ones(2, 4)
    no_clip = torch.zeros(2, 4)
    dropped = clip_cov_drop(cov, mask, no_clip, fraction=0.25, lower=1.0, upper=5.0)
    assert dropped.sum().item() == 2  # int(0.25 * 8)
    assert bool(((dropped > 0) <= ((cov > 1) & (cov < 5))).all())
    assert torch.equal(clip_cov_drop(cov, mask, no_clip, 0.25, 1.0, 5.0), dropped)


def test_sapo_soft_gate_value_and_gradient():
    """SAPO (arXiv 2511.20347): loss_t = -A_t * sigmoid(tau (r_t - 1)) * 4 / tau, tau by the sign of A_t;
    its gradient -A_t * 4 s (1 - s) r_t grad logp_t is PPO's -A_t grad logp_t at r = 1."""
    cfg = build(AlgorithmConfig, policy_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=2.0)
    log_probs = torch.log(torch.tensor([[0.5, 0.5, 0.4]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.5, 0.4]]))  # r = 2, 1, 1
    advantages = torch.tensor([[1.0, -1.0, 2.0]])
    ones = torch.ones(1, 3)
    loss, _ = policy_loss(cfg, log_probs=log_probs, advantages=advantages, mask=ones, weights=ones,
                          metric_weights=ones / 3, old_log_probs=old)

    def sig(x):
        return 1 / (1 + math.exp(-x))

    # token 1: A=1, tau=1, r=2: -sig(1) * 4;  token 2: A=-1, tau=2, r=1: +sig(0) * 2 = 1;  token 3: A=2, tau=1: -2 * 2
    assert loss.item() == pytest.approx(-4 * sig(1) + 1.0 - 4.0, rel=1e-6)
    loss.backward()
    expected_grad = [-1 * 4 * sig(1) * (1 - sig(1)) * 2, 1.0, -2.0]
    assert log_probs.grad[0].tolist() == pytest.approx(expected_grad, rel=1e-5)


def test_gmpo_uses_the_rows_mean_advantage_when_advantages_differ_per_token():
    """Token-level advantages (GAE, REINFORCE++ with gamma < 1, a KL reward, OPD): GMPO has one A_i per
    sequence, so row i's loss is -A_i exp(mean_t l~_t) with A_i the mean over the trained tokens and
    its sign choosing the clip side; every trained token's gradient has the sign of -A_i."""
    cfg = build(AlgorithmConfig, policy_loss="gmpo", eps_clip=0.4, eps_clip_high=0.4)
    log_ratio = torch.tensor([[0.5, 0.1, -0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is not trained: its advantage must not count
    advantages = torch.tensor([[2.0, -0.5, -0.3, -90.0]])  # mean over trained tokens: 0.4 > 0
    old = torch.full((1, 4), -1.0)
    log_probs = (old + log_ratio).requires_grad_()
    weights = aggregation_weights(mask, cfg.aggregation)
    loss, metrics = policy_loss(cfg, log_probs=log_probs, old_log_probs=old, advantages=advantages, mask=mask,
                                weights=weights, metric_weights=weights)
    a = 0.4
    # A_i > 0: min(l, clip l) per token = 0.4 (clipped), 0.1, -0.2
    rho = math.exp((0.4 + 0.1 - 0.2) / 3)
    assert loss.item() == pytest.approx(-a * rho, rel=1e-5)
    loss.backward()
    expected = [0.0, -a * rho / 3, -a * rho / 3, 0.0]  # the clipped token and the untrained one get none
    assert log_probs.grad.tolist()[0] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)


def test_gmpo_sequence_level_advantages_are_unchanged_by_the_row_mean():
    cfg = build(AlgorithmConfig, policy_loss="gmpo", eps_clip=0.2, eps_clip_high=0.3)
    generator = torch.Generator().manual_seed(3)
    log_ratio = torch.randn(4, 6, generator=generator) * 0.3
    mask = (torch.rand(4, 6, generator=generator) > 0.2).float()
    per_row = torch.tensor([[1.5], [-0.7], [0.2], [-2.0]])
    old = torch.full((4, 6), -1.0)
    weights = aggregation_weights(mask, cfg.aggregation)
    losses = []
    for advantages in (per_row.expand(4, 6), per_row.expand(4, 6) + (1 - mask) * 7.0):  # untrained tokens differ
        log_probs = (old + log_ratio).requires_grad_()
        loss, _ = policy_loss(cfg, log_probs=log_probs, old_log_probs=old, advantages=advantages, mask=mask,
                              weights=weights, metric_weights=weights)
        loss.backward()
        losses.append((loss.item(), log_probs.grad.clone()))
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-6)
    assert torch.allclose(losses[0][1], losses[1][1])
