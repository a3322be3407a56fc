"""Per-token KL estimators between the current policy and a reference (Schulman, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html), with the names verl and slime use for
--kl-loss-type. With log r = ref - logp (samples drawn from the current policy):
    k1 = -log r = logp - ref             unbiased, high variance, can be negative
    k2 = (log r)^2 / 2                   biased, low variance
    k3 = (r - 1) - log r                 unbiased, low variance, always >= 0; unclamped, as slime's k3
    low_var_kl = clamp(k3(clamp(log r, -20, 20)), -10, 10)
                                         k3 with the log-ratio clamped before exp (so value and gradient
                                         stay finite for any input) and its outliers cut (slime's and
                                         verl's low_var_kl; verl also calls this k3)"""

from __future__ import annotations

import torch

from lean_rl.algorithms.names import KL_TYPES

LOW_VAR_KL_BOUND = 10.0
LOG_RATIO_BOUND = 20.0  # exp(20) ~ 5e8: finite in float32, and so is its gradient


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise estimate of KL(pi || pi_ref) at each token; differentiable in `log_probs`."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return log_ratio.square() / 2
    if kind == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    if kind == "low_var_kl":
        # clamp before exp: with ref - logp ~ 90, exp overflows to inf and its gradient is inf * 0 = NaN,
        # even though the outer clamp makes the value finite
        log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return (torch.exp(-log_ratio) - 1 + log_ratio).clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
    raise ValueError(f"--kl-loss-type {kind!r}: choose one of {', '.join(KL_TYPES)}")
