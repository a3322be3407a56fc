"""The policy losses beyond PPO's clipped ratio (losses.policy_loss dispatches to them on --policy-loss):

    cispo     (MiniMax-M1, arXiv 2506.13585)  pg_t = -sg(clamp(r_t, 1 - eps_clip, 1 + eps_clip_high)) * A_t * logp_t:
              the clipped IS weight is detached and scales the log-prob gradient, so no token's
              gradient is dropped (a clipped token keeps gradient -w_t A_t grad logp_t)
    gmpo      (GMPO, arXiv 2507.20673)  per sequence -A_i * exp(mean_t l~_t), with the token log-ratio
              l_t = logp_t - old_t clipped in log space, sign-aware (as PPO's min):
              l~_t = s * min(s * l_t, s * clamp(l_t, -eps_clip, eps_clip_high)),  s = sign(A_i);
              A_i is the row's one advantage: with token-level advantages, their mean over the trained tokens
    kl_cov    (Cui et al., arXiv 2505.22617)  pg_t = -A_t r_t (no ratio clip), plus ppo_kl_coef * |logp_t - old_t|
              on the kl_cov_ratio fraction of trained tokens with the largest covariance
    clip_cov  (same paper)  PPO's clipped loss; of the tokens PPO did not clip whose covariance lies in
              (clip_cov_lb, clip_cov_ub), a random clip_cov_ratio fraction (of all trained tokens) get no gradient
              (their loss value is kept, detached; verl zeroes it: the same gradient)

    sapo      (Gao et al., arXiv 2511.20347)  pg_t = -A_t * f(r_t), f(r) = sigmoid(tau (r - 1)) * 4 / tau, a soft
              gate in place of the hard clip (gradient -A_t * 4 s (1 - s) r_t grad logp_t, equal to PPO's at r = 1);
              tau = --sapo-tau-pos for A_t > 0, --sapo-tau-neg otherwise

Covariance per token (both *_cov losses): cov_t = (logp_t - mean logp) * (A_t - mean A), the means over
the trained tokens of the tensors given: the policy loss runs per micro-batch on each trainer rank,
so (as in verl) they are the micro-batch's statistics, not the step's."""

from __future__ import annotations

import zlib

import torch


def cispo(log_probs: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor, eps_clip: float,
          eps_clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token CISPO loss, 1.0 where the IS weight was clipped). A lower bound 1 - eps_clip <= 0
    (eps_clip >= 1, MiniMax-M1's setting) clips nothing from below."""
    weight = ratio.detach().clamp(min=1 - eps_clip, max=1 + eps_clip_high)
    return -weight * advantages * log_probs, (weight != ratio.detach()).float()


def sapo(ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """Per-token SAPO loss: the soft gate sigmoid(tau (r - 1)) * 4 / tau of the ratio, times -A."""
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    return -advantages * torch.sigmoid(tau * (ratio - 1)) * 4 / tau


def sequence_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, 1] mean advantage over each row's trained tokens: GMPO's A_i. Equal to every token's advantage
    when the estimator gives one per sequence (GRPO, RLOO...); the mean of them when it gives one per
    token (GAE, REINFORCE++ with gamma < 1 or a KL reward, on-policy distillation), as verl's geo_mean does."""
    mask = mask.float()
    return (advantages * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def gmpo_log_ratio(log_ratio: torch.Tensor, advantage: torch.Tensor, mask: torch.Tensor, eps_low: float,
                   eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(GMPO sequence log-ratio mean_t l~_t broadcast to the row in token form, 1.0 where a token's
    log-ratio was clipped). `advantage` is the row's one advantage A_i ([B, 1], see sequence_advantage):
    its sign picks the clip side for every token of the row, as in the paper. Token form: the value at
    every token of row i is the sequence's, the gradient at token t that of l~_t, so with
    seq-mean-token-mean weights (1 / (n L_i)) the summed gradient is exactly that of
    -mean_i A_i exp(mean_t l~_t)."""
    mask = mask.float()
    sign = torch.sign(advantage)
    clamped = log_ratio.clamp(-eps_low, eps_high)
    token = sign * torch.minimum(sign * log_ratio, sign * clamped)
    mean = (token * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return token - token.detach() + mean.detach(), (token != log_ratio).float()


def token_covariance(log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """cov_t = (logp_t - mean logp) * (A_t - mean A) over the trained tokens (detached; 0 elsewhere)."""
    mask = mask.float()
    count = mask.sum().clamp(min=1)
    log_probs = log_probs.detach()
    centred_logp = log_probs - (log_probs * mask).sum() / count
    centred_adv = advantages - (advantages * mask).sum() / count
    return centred_logp * centred_adv * mask


def top_covariance(cov: torch.Tensor, mask: torch.Tensor, fraction: float) -> torch.Tensor:
    """1.0 on the max(1, int(fraction * trained tokens)) trained tokens of largest covariance (KL-Cov)."""
    trained = mask > 0
    count = int(trained.sum())
    selected = torch.zeros_like(cov)
    if count == 0:
        return selected
    k = max(1, int(fraction * count))
    ranked = torch.where(trained, cov, torch.full_like(cov, -torch.inf)).flatten()
    selected.view(-1)[torch.topk(ranked, k).indices] = 1.0
    return selected


def clip_cov_drop(cov: torch.Tensor, mask: torch.Tensor, ppo_clipped: torch.Tensor, fraction: float,
                  lower: float, upper: float) -> torch.Tensor:
    """1.0 on the tokens Clip-Cov takes the gradient from: up to max(1, int(fraction * trained tokens))
    drawn at random among the trained tokens PPO did not clip with lower < cov_t < upper. The draw is
    seeded by the candidates' covariances, so the same micro-batch always drops the same tokens."""
    candidates = (mask > 0) & (ppo_clipped == 0) & (cov > lower) & (cov < upper)
    positions = torch.nonzero(candidates.flatten()).squeeze(-1)
    dropped = torch.zeros_like(cov)
    if positions.numel() == 0:
        return dropped
    limit = max(1, int(fraction * int((mask > 0).sum())))
    values = cov.flatten()[positions].detach().double().cpu().numpy()
    generator = torch.Generator().manual_seed(zlib.crc32(values.tobytes()))
    chosen = positions[torch.randperm(positions.numel(), generator=generator)[:limit].to(positions.device)]
    dropped.view(-1)[chosen] = 1.0
    return dropped
