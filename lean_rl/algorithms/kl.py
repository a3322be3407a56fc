"""Per-token KL estimators between the current policy and a reference (Schulman, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html), with the names verl and slime use for
--kl-loss-type. With log r = ref - logp (samples drawn from the current policy):
    k1 = -log r = logp - ref             unbiased, high variance, can be negative
    k2 = (log r)^2 / 2                   biased, low variance
    k3 = (r - 1) - log r                 unbiased, low variance, always >= 0
    low_var_kl = clamp(k3, -10, 10)      k3 with its outliers cut (slime / verl)"""

from __future__ import annotations

import torch

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
LOW_VAR_KL_BOUND = 10.0


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise estimate of KL(pi || pi_ref) at each token; differentiable in `log_probs`."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return log_ratio.square() / 2
    if kind in ("k3", "low_var_kl"):
        kl = torch.exp(-log_ratio) - 1 + log_ratio
        return kl.clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND) if kind == "low_var_kl" else kl
    raise ValueError(f"--kl-loss-type {kind!r}: choose one of {', '.join(KL_TYPES)}")
