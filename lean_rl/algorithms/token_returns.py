"""The token-level side of the advantage estimators (advantages.py): a sequence value broadcast to its
response's tokens, the batch whitening over trained tokens, the per-token rewards (the sequence reward on
the last policy token), discounted returns, GAE, and REINFORCE++. Tensors are response-aligned [B, T]
with a mask that is 1 on tokens the loss trains; tokens with mask 0 inside a response (tool output) are
not time steps: returns and GAE pass through them unchanged."""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8


def broadcast(sequence_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return sequence_values.float().unsqueeze(-1) * mask.float()


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the masked entries (unbiased var); 0 where mask is 0."""
    mask = mask.float()
    count = mask.sum()
    if count < 2:
        raise ValueError(f"cannot whiten advantages over {int(count)} trainable token(s)")
    mean = (values * mask).sum() / count
    var = (((values - mean) * mask) ** 2).sum() / (count - 1)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] zeros with r_i on the last masked token of row i (rows without one stay 0)."""
    mask = mask.float()
    out = torch.zeros_like(mask)
    positions = torch.arange(mask.shape[-1]).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=-1).values
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards.float()[rows]
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over masked steps; unmasked positions pass G through (and get 0)."""
    mask = mask.float()
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[-1])):
        m = mask[:, t]
        running = m * (token_rewards[:, t] + gamma * running) + (1 - m) * running
        returns[:, t] = running * m
    return returns


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over masked steps (V after the last step is 0):
    delta_t = r_t + gamma V_next - V_t,  A_t = delta_t + gamma lam A_next,  returns = A + V."""
    mask = mask.float()
    advantages = torch.zeros_like(values, dtype=torch.float32)
    next_value = torch.zeros(values.shape[0])
    next_advantage = torch.zeros(values.shape[0])
    for t in reversed(range(values.shape[-1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * m
        next_value = m * values[:, t] + (1 - m) * next_value
        next_advantage = m * advantage + (1 - m) * next_advantage
    return advantages, (advantages + values) * mask


def reinforce_plus_plus(rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float,
                        gamma: float) -> torch.Tensor:
    token_rewards = -kl_coef * kl * mask.float() + last_token_rewards(rewards, mask)
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)
