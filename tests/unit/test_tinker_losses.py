"""lean_rl/algorithms/tinker_losses.py against each loss's closed form (sums, masked)."""

import math

import pytest
import torch

from lean_rl.algorithms.tinker_losses import check_loss, tinker_loss

LOGP = torch.tensor([[-1.0, -2.0, -0.5]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])
Q = torch.tensor([[-1.2, -1.5, -9.0]])
A = torch.tensor([[2.0, -1.0, 5.0]])


def test_cross_entropy_is_the_weighted_sum():
    loss = tinker_loss("cross_entropy", LOGP, {"weights": torch.tensor([[0.0, 1.0, 1.0]])}, MASK, {})
    assert float(loss) == pytest.approx(2.0)


def test_importance_sampling_ppo_and_cispo():
    r = [math.exp(0.2), math.exp(-0.5)]
    inputs = {"logprobs": Q, "advantages": A}
    assert float(tinker_loss("importance_sampling", LOGP, inputs, MASK, {})) == pytest.approx(-(2 * r[0] - r[1]))
    ppo = -(min(r[0] * 2, 1.2 * 2) + min(r[1] * -1, 0.8 * -1))
    assert float(tinker_loss("ppo", LOGP, inputs, MASK, {})) == pytest.approx(ppo)
    cispo = -(1.2 * -1.0 * 2 + 0.8 * -2.0 * -1)
    assert float(tinker_loss("cispo", LOGP, inputs, MASK, {})) == pytest.approx(cispo)


def test_cispo_passes_gradient_through_logp_only():
    logp = LOGP.clone().requires_grad_()
    tinker_loss("cispo", logp, {"logprobs": Q, "advantages": A}, MASK, {}).backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.2 * 2, -0.8 * -1, 0.0]]))


def test_refusals_name_the_loss_input_or_config():
    with pytest.raises(ValueError, match="loss_fn 'stable_reinforce' is not supported"):
        check_loss("stable_reinforce", set(), {})
    with pytest.raises(ValueError, match="loss_fn ppo: loss_fn_inputs lacks advantages"):
        check_loss("ppo", {"logprobs"}, {})
    with pytest.raises(ValueError, match="loss_fn_config beta is not supported"):
        check_loss("cispo", {"logprobs", "advantages"}, {"beta": 1.0})
