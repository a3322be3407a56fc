"""slime.utils.ppo_utils: the two estimators slime's custom losses build on, with slime's meaning.

compute_approx_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio=None): log r = log_probs -
base; k1 = log r, k2 = (log r)^2 / 2, k3 and low_var_kl = exp(-log r) - 1 + log r, low_var_kl
clamped to [-10, 10]; times importance_ratio when given. compute_policy_loss(ppo_kl, advantages,
eps_clip, eps_clip_high, eps_clip_c=None): PPO's clipped loss per token at ratio exp(-ppo_kl), and
where the clip applied (lean_rl's ppo_clip, dual clip with eps_clip_c)."""

from __future__ import annotations

import torch

from lean_rl.algorithms.losses import ppo_clip

__all__ = ["compute_approx_kl", "compute_policy_loss"]


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_loss_type: str,
                      importance_ratio: torch.Tensor | None = None) -> torch.Tensor:
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio ** 2 / 2.0
    elif kl_loss_type in ("k3", "low_var_kl"):
        kl = (-log_ratio).exp() - 1 + log_ratio
    else:
        raise ValueError(f"compute_approx_kl: kl_loss_type {kl_loss_type!r}: choose k1, k2, k3 or low_var_kl")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    return kl.clamp(min=-10, max=10) if kl_loss_type == "low_var_kl" else kl


def compute_policy_loss(ppo_kl: torch.Tensor, advantages: torch.Tensor, eps_clip: float, eps_clip_high: float,
                        eps_clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(f"compute_policy_loss: eps_clip_c must be > 1 (dual-clip PPO), got {eps_clip_c}")
    return ppo_clip((-ppo_kl).exp(), advantages, eps_clip, eps_clip_high, eps_clip_c)
