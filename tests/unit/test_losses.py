"""KL estimators, policy / value losses, off-policy weights and aggregation against numbers worked
out by hand."""

import math

import pytest
import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.kl import kl_estimate
from lean_rl.algorithms.losses import (aggregate, aggregation_weights, behaviour_weights, policy_loss, ppo_clip,
                                       sequence_ratio, tis_weights, value_loss)

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
    cfg = AlgorithmConfig(kl_loss_coef=0.1, kl_loss_type="k1", entropy_coef=0.01)
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
    loss, metrics = policy_loss(AlgorithmConfig(), **inputs)
    assert loss.item() == pytest.approx(0.5 * (-1.0 + 1.0))  # ratio 1: -A
    loss.backward()
    # d/dlogp of -A * exp(logp - sg(logp)) at ratio 1 = -A, times weight 0.5
    assert torch.allclose(inputs["log_probs"].grad, torch.tensor([[-0.5, 0.5]]))
    assert metrics["ppo_kl"].item() == 0.0


def test_tis_scales_the_policy_gradient_term():
    inputs = _inputs()
    rollout = torch.log(torch.tensor([[0.1, 0.8]]))  # old = current: weights min(5, 2) = 2 and 0.5
    loss, metrics = policy_loss(AlgorithmConfig(use_tis=True, tis_clip=2.0), rollout_log_probs=rollout, **inputs)
    assert loss.item() == pytest.approx(0.5 * (-1.0 * 2.0 + 1.0 * 0.5))
    assert metrics["tis_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["tis_weight"].item() == pytest.approx(0.5 * (2.0 + 0.5))


def test_decoupled_ppo_clips_against_the_proximal_policy_and_weights_by_behaviour():
    inputs = _inputs()
    prox = torch.log(torch.tensor([[0.25, 0.4]]))  # ratio vs proximal: 2.0 (clipped to 1.2), 1.0
    behav = torch.log(torch.tensor([[0.125, 0.1]]))  # exp(prox - behav) = 2.0, 4.0 (above cap 3: dropped)
    cfg = AlgorithmConfig(decoupled_ppo=True, behav_imp_weight_cap=3.0)
    loss, metrics = policy_loss(cfg, old_log_probs=prox, rollout_log_probs=behav, **inputs)
    assert loss.item() == pytest.approx(0.5 * (-1.2 * 2.0 + 1.0 * 0.0))
    assert metrics["behav_dropped_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="proximal"):
        policy_loss(cfg, rollout_log_probs=behav, **_inputs())


def test_gspo_policy_loss_uses_the_sequence_ratio():
    inputs = _inputs()
    old = torch.log(torch.tensor([[0.25, 0.4]]))  # token ratios 2 and 1 -> sequence ratio sqrt(2) = 1.414
    loss, _ = policy_loss(AlgorithmConfig(advantage_estimator="gspo", eps_clip=0.5), old_log_probs=old, **inputs)
    r = math.sqrt(2)
    # token 1: A=1: max(-r, -1.414 clipped to 1.5 -> -r) = -r; token 2: A=-1: max(r, r) = r
    assert loss.item() == pytest.approx(0.5 * (-r + r), abs=1e-6)
