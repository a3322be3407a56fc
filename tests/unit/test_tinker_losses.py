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


def test_dro_is_the_advantage_term_less_the_quadratic_penalty():
    # token 0: logp -1, q -1.2, A 2; token 1: logp -2, q -1.5, A -1 (token 2 is padding)
    beta = 0.5
    dro = -((-1.0 * 2 - 0.25 * 0.2 ** 2) + (-2.0 * -1 - 0.25 * 0.5 ** 2))
    assert float(tinker_loss("dro", LOGP, {"logprobs": Q, "advantages": A}, MASK, {"beta": beta})) == pytest.approx(dro)
    logp = LOGP.clone().requires_grad_()
    tinker_loss("dro", logp, {"logprobs": Q, "advantages": A}, MASK, {"beta": beta}).backward()
    # d/dlogp = -(A - beta (logp - q))
    assert torch.allclose(logp.grad, torch.tensor([[-(2 - 0.5 * 0.2), -(-1 - 0.5 * -0.5), 0.0]]))


def test_gspo_clips_the_sequence_ratio_and_keeps_token_gradients():
    # two datums; the ratio mask leaves datum 0's first token out of its sequence ratio
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.4, 0.0]], requires_grad=True)
    q = torch.tensor([[-5.0, -2.5, -9.0], [-0.2, -0.6, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    in_ratio = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])  # padding is never in the ratio
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    s0, s1 = math.exp(0.5), math.exp((-0.1 + 0.2) / 2)  # datum 0: clipped to 1.1; datum 1 inside
    want = -(1 * 1.1 + 1 * 1.1) - (s1 * 1 + s1 * -1)
    inputs = {"logprobs": q, "advantages": adv, "sequence_ratio_mask": in_ratio}
    loss = tinker_loss("gspo", logp, inputs, mask, config)
    assert float(loss.detach()) == pytest.approx(want)
    loss.backward()
    # min(sA, clip(s)A) picks the clipped (constant) side for datum 0 (A > 0, s > 1.1): no gradient;
    # datum 1's tokens each get -s1 * A_t through their own log-prob
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [-s1, s1, 0.0]]), atol=1e-6)
    assert s0 > 1.1


def test_refusals_name_the_loss_input_or_config():
    with pytest.raises(ValueError, match="loss_fn 'stable_reinforce' is not supported"):
        check_loss("stable_reinforce", set(), {})
    with pytest.raises(ValueError, match="loss_fn ppo: loss_fn_inputs lacks advantages"):
        check_loss("ppo", {"logprobs"}, {})
    with pytest.raises(ValueError, match="loss_fn_config beta is not supported"):
        check_loss("cispo", {"logprobs", "advantages"}, {"beta": 1.0})
    with pytest.raises(ValueError, match="loss_fn dro: loss_fn_config needs beta"):
        check_loss("dro", {"logprobs", "advantages"}, {})
    with pytest.raises(ValueError, match="loss_fn gspo: loss_fn_inputs lacks sequence_ratio_mask"):
        check_loss("gspo", {"logprobs", "advantages"}, {})
    with pytest.raises(ValueError, match="loss_fn gspo: loss_fn_config needs clip_high_threshold"):
        check_loss("gspo", {"logprobs", "advantages", "sequence_ratio_mask"}, {"clip_low_threshold": 0.8})
    with pytest.raises(ValueError, match="loss_fn 'custom' is not supported"):
        check_loss("custom", set(), {})
