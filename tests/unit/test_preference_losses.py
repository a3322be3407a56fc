"""The pair losses (lean_rl/algorithms/preference.py) against hand-computed values, against TRL's
DPOTrainer formulas (restated here from trl/trainer/dpo_trainer.py's dpo_loss: logits = pi_logratios -
ref_logratios; sigmoid with label smoothing, hinge, ipo), and the per-row coefficients the trainer takes
against the gradient of the true loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.preference import (bradley_terry_coefficients, bradley_terry_losses, dpo_coefficients,
                                           dpo_pair_losses, pair_rows, pairwise_advantages, pairwise_loss)
from lean_rl.options import ConfigError


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_dpo_sigmoid_by_hand():
    # h = (-5 - -6) - (-7 - -6.5) = 1.5; beta h = 0.15; -log sigmoid(0.15) = log(1 + e^-0.15)
    loss = dpo_pair_losses(torch.tensor([-5.0]), torch.tensor([-7.0]), torch.tensor([-6.0]), torch.tensor([-6.5]), 0.1)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.15)), abs=1e-6)
    assert loss.item() == pytest.approx(0.620957, abs=1e-6)


def test_dpo_variants_by_hand():
    args = torch.tensor([-5.0]), torch.tensor([-7.0]), torch.tensor([-6.0]), torch.tensor([-6.5])
    assert dpo_pair_losses(*args, 0.1, "hinge").item() == pytest.approx(1 - 0.15)
    assert dpo_pair_losses(*args, 0.1, "ipo").item() == pytest.approx((1.5 - 5.0) ** 2)  # (h - 1/(2 beta))^2
    smoothed = dpo_pair_losses(*args, 0.1, "sigmoid", label_smoothing=0.2).item()
    assert smoothed == pytest.approx(-0.8 * math.log(_sigmoid(0.15)) - 0.2 * math.log(_sigmoid(-0.15)), abs=1e-6)
    assert dpo_pair_losses(*args, 2.0, "hinge").item() == 0.0  # beta h = 3 > 1: no loss


def _trl_losses(pc, pr, rc, rr, beta, loss_type, label_smoothing=0.0):
    """TRL's DPOTrainer.dpo_loss, restated: logits = (pc - pr) - (rc - rr)."""
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    if loss_type == "hinge":
        return torch.relu(1 - beta * logits)
    return (logits - 1 / (2 * beta)) ** 2


@pytest.mark.parametrize("loss_type,smoothing", [("sigmoid", 0.0), ("sigmoid", 0.1), ("hinge", 0.0), ("ipo", 0.0)])
def test_dpo_matches_trl(loss_type, smoothing):
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-10 * torch.rand(16, generator=g) for _ in range(4))
    for beta in (0.05, 0.5, 2.0):
        ours = dpo_pair_losses(pc, pr, rc, rr, beta, loss_type, smoothing)
        assert torch.allclose(ours, _trl_losses(pc, pr, rc, rr, beta, loss_type, smoothing), atol=1e-6)


def test_bradley_terry_by_hand():
    assert bradley_terry_losses(torch.tensor([2.0]), torch.tensor([0.5])).item() == pytest.approx(
        math.log(1 + math.exp(-1.5)), abs=1e-6)


def _pairs_batch():
    # 2 pairs, rows: group 0 = (rejected, chosen), group 1 = (chosen, rejected); token log-probs [4, 3]
    policy = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -1.0], [-1.0, -1.0, -1.0], [-3.0, -1.0, 0.0]])
    reference = torch.tensor([[-1.5, -1.5, 0.0], [-1.0, -1.0, -1.0], [-1.0, -2.0, -1.0], [-2.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.float)
    return policy, reference, mask, torch.tensor([0, 0, 1, 1]), torch.tensor([0.0, 1.0, 1.0, 0.0])


def test_dpo_coefficients_by_hand():
    policy, reference, mask, groups, rewards = _pairs_batch()
    coef, metrics = dpo_coefficients(policy, reference, mask, groups, rewards, beta=0.5, loss_type="sigmoid")
    # pair 0: chosen row 1: log pi -2, log ref -3; rejected row 0: -3, -3 -> h = 1
    # pair 1: chosen row 2: -3, -4; rejected row 3: -4, -3 -> h = 2
    s0, s1 = _sigmoid(-0.5), _sigmoid(-1.0)
    expected = torch.tensor([0.5 * s0 / 2, -0.5 * s0 / 2, -0.5 * s1 / 2, 0.5 * s1 / 2])
    assert torch.allclose(coef, expected, atol=1e-6)
    assert metrics["loss"] == pytest.approx((-math.log(_sigmoid(0.5)) - math.log(_sigmoid(1.0))) / 2, abs=1e-6)
    assert metrics["margin"] == pytest.approx(0.5 * 1.5) and metrics["accuracy"] == 1.0
    assert metrics["chosen_reward"] == pytest.approx(0.5 * (1 + 1) / 2)


def test_ipo_coefficients_are_length_normalised():
    policy, reference, mask, groups, rewards = _pairs_batch()
    coef, _ = dpo_coefficients(policy, reference, mask, groups, rewards, beta=0.5, loss_type="ipo")
    # pair 0: means: chosen (-2/3) - (-1) = 1/3, rejected (-3/2) - (-3/2) = 0 -> h = 1/3; dL/dh = 2 (h - 1)
    d0 = 2 * (1 / 3 - 1) / 2
    assert coef[1].item() == pytest.approx(d0 / 3, abs=1e-6) and coef[0].item() == pytest.approx(-d0 / 2, abs=1e-6)


def test_surrogate_gradient_is_the_dpo_gradient():
    """The ranks minimise sum c_i * log pi(y_i) with c_i detached; its gradient must be the DPO loss's."""
    torch.manual_seed(0)
    weights = torch.randn(4, 3, requires_grad=True)  # a toy policy: token log-probs = -softplus(weights)
    _, reference, mask, groups, rewards = _pairs_batch()
    for loss_type in ("sigmoid", "hinge", "ipo", "sigmoid_norm"):
        algo = AlgorithmConfig(loss_type="dpo_loss", dpo_beta=0.3, dpo_loss_type=loss_type, aggregation="token-mean",
                               policy_loss="ppo", eps_clip_high=0.2, rs_lower_bound=0.5)
        token_log_probs = -F.softplus(weights)
        advantages, _ = pairwise_advantages(algo, token_log_probs.detach(), reference, mask, groups, rewards)
        surrogate, _ = pairwise_loss(algo, log_probs=token_log_probs, advantages=advantages, mask=mask)
        (ours,) = torch.autograd.grad(surrogate, weights)
        mean = loss_type in ("ipo", "sigmoid_norm")
        token_log_probs = -F.softplus(weights)
        seq = (token_log_probs * mask).sum(-1) / (mask.sum(-1) if mean else 1)
        ref = (reference * mask).sum(-1) / (mask.sum(-1) if mean else 1)
        true = dpo_pair_losses(seq[[1, 2]], seq[[0, 3]], ref[[1, 2]], ref[[0, 3]], 0.3, loss_type).mean()
        (expected,) = torch.autograd.grad(true, weights)
        assert torch.allclose(ours, expected, atol=1e-6), loss_type


def test_bradley_terry_coefficients_by_hand():
    scores = torch.tensor([0.2, 1.0, -0.3, 0.4])  # pair 0: chosen row 1, rejected row 0; pair 1: chosen 2, rejected 3
    coef, metrics = bradley_terry_coefficients(scores, torch.tensor([0, 0, 1, 1]), torch.tensor([0.0, 1.0, 1.0, 0.0]))
    s0, s1 = _sigmoid(-0.8), _sigmoid(0.7)
    assert torch.allclose(coef, torch.tensor([s0 / 2, -s0 / 2, -s1 / 2, s1 / 2]), atol=1e-6)
    assert metrics["accuracy"] == 0.5 and metrics["margin"] == pytest.approx((0.8 - 0.7) / 2)


def test_pairs_must_be_marked():
    with pytest.raises(ValueError, match="group 0: a preference pair is two samples"):
        pair_rows(torch.tensor([0, 0]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="got 3 samples"):
        pair_rows(torch.tensor([0, 0, 0]), torch.tensor([1.0, 0.0, 0.0]))


def test_dpo_flags_are_checked():
    with pytest.raises(ConfigError, match="--dpo-label-smoothing must be in"):
        AlgorithmConfig(loss_type="dpo_loss", dpo_label_smoothing=0.5, aggregation="token-mean", policy_loss="ppo",
                        eps_clip_high=0.2, rs_lower_bound=0.5)
    with pytest.raises(ConfigError, match="--dpo-label-smoothing applies to"):
        AlgorithmConfig(loss_type="dpo_loss", dpo_loss_type="ipo", dpo_label_smoothing=0.1, aggregation="token-mean",
                        policy_loss="ppo", eps_clip_high=0.2, rs_lower_bound=0.5)
    assert AlgorithmConfig(loss_type="dpo_loss", aggregation="token-mean", policy_loss="ppo", eps_clip_high=0.2,
                           rs_lower_bound=0.5).needs_reference
