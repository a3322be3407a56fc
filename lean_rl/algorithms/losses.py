"""Per-token policy and value losses, off-policy weights, and loss aggregation.

All tensors are [rows, time] and aligned; `mask` is 1 on trained tokens. A micro-batch's loss is
sum(weights * per_token_loss), where `weights` come from `aggregation_weights` computed once over the
whole optimizer step (the driver knows every sequence of it), so splitting a step into micro-batches
and data-parallel ranks never changes the objective.

Policy ratio (against the old policy pi_old: recomputed, or the current policy detached when the
step is the first after generation and nothing else is asked for):
    ppo   r_t = exp(logp_t - old_t), clipped to [1 - eps_clip, 1 + eps_clip_high]; with
          --eps-clip-c c (dual clip) the loss of a negative-advantage token is capped at -c * A_t
    gspo  r_i = exp(mean_t(logp - old)) for the whole sequence (geometric mean of token ratios), clipped
          the same way; its gradient flows through every token (GSPO-token form, value equals r_i)
    cispo, gmpo, kl_cov, clip_cov, sapo: see policy_losses.py
Off-policy correction against the rollout (behaviour) log-probs from the engine, detached; with
log w = old - rollout per token (--tis-level / --rs-level token), summed over the sequence (sequence)
or averaged (geometric, the geometric mean of token ratios):
    TIS        w_t = clamp(exp(log w), tis_clip_low, tis_clip)
    RS         masked IS: a token (or its whole sequence) with exp(log w) outside
               [--rs-lower-bound, --rs-upper-bound] gets weight 0 (it still counts in the denominator)
    decoupled  (AReaL) the ratio is taken against the proximal policy (old = recomputed) and
               w_t = exp(prox_t - behav_t); tokens with w_t > --behav-imp-weight-cap get weight 0
Total per token: w_t * pg_t + kl_loss_coef * KL_t(pi || pi_ref) - entropy_coef * H_t."""

from __future__ import annotations

import math

import torch

from lean_rl.algorithms.kl import kl_estimate
from lean_rl.algorithms.names import AGGREGATION_MODES, IS_LEVELS
from lean_rl.algorithms.slime_contracts import custom_tis
from lean_rl.algorithms.policy_losses import (clip_cov_drop, cispo, gmpo_log_ratio, sapo, sequence_advantage,
                                              token_covariance, top_covariance)

LOG_RATIO_MAX = 20.0  # exp() guard: a ratio of e^20 is clipped by PPO anyway


def aggregation_weights(mask: torch.Tensor, mode: str, norm_length: int | None = None,
                        sample_weights: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] weights w with aggregate(x) = sum(w * x):
        token-mean               sum_{i,t} x / (number of masked tokens)
        seq-mean-token-mean      mean over sequences of (mean over the sequence's tokens)
        seq-mean-token-sum       mean over sequences of (sum over the sequence's tokens)
        seq-mean-token-sum-norm  mean over sequences of (sum over tokens) / norm_length (Dr. GRPO)
    Sequences without a masked token (FAILED samples) count in no denominator.
    `sample_weights` [B] (Sample.loss_weight; None: all 1): sequence i counts s_i times, in the sums and
    in the denominators (token counts and sequence counts weighted by s_i), so a trajectory split into n
    samples of weight 1/n counts as one sequence; with all s_i = 1 the modes are the plain ones above."""
    mask = mask.float()
    scale = torch.ones(mask.shape[0], 1) if sample_weights is None else sample_weights.float().reshape(-1, 1)
    tokens_per_seq = mask.sum(dim=-1, keepdim=True)
    # clamped away from 0 only to avoid 0/0: with nothing trained every numerator is 0 too
    num_seqs = (scale * (tokens_per_seq > 0).float()).sum().clamp(min=1e-12)
    weighted = mask * scale
    if mode == "token-mean":
        return weighted / weighted.sum().clamp(min=1e-12)
    if mode == "seq-mean-token-mean":
        return weighted / tokens_per_seq.clamp(min=1) / num_seqs
    if mode == "seq-mean-token-sum":
        return weighted / num_seqs
    if mode == "seq-mean-token-sum-norm":
        if not norm_length or norm_length <= 0:
            raise ValueError("--loss-agg-mode seq-mean-token-sum-norm needs a positive --loss-norm-length")
        return weighted / (num_seqs * norm_length)
    raise ValueError(f"--loss-agg-mode {mode!r}: choose one of {', '.join(AGGREGATION_MODES)}")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None) -> torch.Tensor:
    return (values * aggregation_weights(mask, mode, norm_length)).sum()


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(max=LOG_RATIO_MAX))


def ppo_clip(ratio: torch.Tensor, advantages: torch.Tensor, eps_clip: float, eps_clip_high: float,
             eps_clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss, 1.0 where the clipped branch was taken)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_taken = (clipped > unclipped).float()
    if eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -eps_clip_c * advantages), loss)
    return loss, clip_taken


def token_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    return _ratio(log_probs - old_log_probs)


def sequence_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: exp(mean of token log-ratios over each row's masked tokens), broadcast to the row; the
    value is the sequence ratio, the gradient that of the token log-prob scaled by it."""
    mask = mask.float()
    seq_log_ratio = ((log_probs - old_log_probs) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return _ratio(log_probs - log_probs.detach() + seq_log_ratio.detach())




def rollout_log_ratio(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                      level: str = "token") -> torch.Tensor:
    """log of the importance ratio pi_train / pi_rollout (detached), per token [B, T]:
        token      old_t - rollout_t
        sequence   sum_t (old_t - rollout_t) over the row's trained tokens (the product of token ratios)
        geometric  mean_t (old_t - rollout_t) (the geometric mean of token ratios)
    the two sequence levels broadcast to every token of the row."""
    log_ratio = (old_log_probs.detach() - rollout_log_probs) * mask
    if level == "token":
        return log_ratio
    total = log_ratio.sum(-1, keepdim=True)
    if level == "sequence":
        return total.expand_as(log_ratio)
    if level == "geometric":
        return (total / mask.sum(-1, keepdim=True).clamp(min=1)).expand_as(log_ratio)
    raise ValueError(f"importance-sampling level {level!r}: choose one of {', '.join(IS_LEVELS)}")


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, clip: float,
                clip_low: float = 0.0, mask: torch.Tensor | None = None,
                level: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling weights clamp(ratio, clip_low, clip) at `level` (detached) and
    1.0 where the bound applied."""
    mask = torch.ones_like(rollout_log_probs) if mask is None else mask
    raw = _ratio(rollout_log_ratio(old_log_probs, rollout_log_probs, mask, level).clamp(min=-LOG_RATIO_MAX))
    return raw.clamp(min=clip_low, max=clip), ((raw > clip) | (raw < clip_low)).float()


def rejection_mask(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                   lower: float, upper: float, level: str = "token") -> torch.Tensor:
    """Masked importance sampling: 1.0 where the ratio at `level` lies in [lower, upper], 0 where the
    token (or its whole sequence) is rejected."""
    log_ratio = rollout_log_ratio(old_log_probs, rollout_log_probs, mask, level)
    return ((log_ratio >= math.log(lower)) & (log_ratio <= math.log(upper))).float()


def behaviour_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                      cap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO behaviour importance weights exp(prox - behav) (detached), 0 above `cap`;
    second value: 1.0 where a token was dropped by the cap."""
    raw = _ratio(proximal_log_probs.detach() - behaviour_log_probs)
    dropped = (raw > cap).float() if cap is not None else torch.zeros_like(raw)
    return raw * (1 - dropped), dropped


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO critic loss 0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped = old + clamp(v - old, +-clip);
    second value: 1.0 where the clipped term was larger."""
    unclipped = (values - returns) ** 2
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def _policy_gradient_term(cfg, log_probs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
                          mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-token policy-gradient loss of --policy-loss, its metrics) before off-policy weights."""
    if cfg.policy_loss == "gmpo":
        advantage = sequence_advantage(advantages, mask)  # GMPO has one advantage per sequence
        seq_log_ratio, clipped = gmpo_log_ratio(log_probs - old, advantage, mask, cfg.eps_clip, cfg.eps_clip_high)
        return -advantage * _ratio(seq_log_ratio), {"pg_clipfrac": clipped}
    if cfg.policy_loss == "gspo":
        ratio = sequence_ratio(log_probs, old, mask)
    else:
        ratio = token_ratio(log_probs, old)
    if cfg.policy_loss == "cispo":
        pg, clipped = cispo(log_probs, ratio, advantages, cfg.eps_clip, cfg.eps_clip_high)
        return pg, {"pg_clipfrac": clipped}
    if cfg.policy_loss == "sapo":
        return sapo(ratio, advantages, cfg.sapo_tau_pos, cfg.sapo_tau_neg), {}
    if cfg.policy_loss == "kl_cov":
        penalised = top_covariance(token_covariance(log_probs, advantages, mask), mask, cfg.kl_cov_ratio)
        pg = -advantages * ratio + penalised * cfg.ppo_kl_coef * (log_probs - old).abs()
        return pg, {"kl_cov_frac": penalised}
    pg, clip_taken = ppo_clip(ratio, advantages, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
    metrics = {"pg_clipfrac": clip_taken}
    if cfg.policy_loss == "clip_cov":
        dropped = clip_cov_drop(token_covariance(log_probs, advantages, mask), mask, clip_taken,
                                cfg.clip_cov_ratio, cfg.clip_cov_lb, cfg.clip_cov_ub)
        pg = torch.where(dropped > 0, pg.detach(), pg)  # the value stays, the gradient goes
        metrics["clip_cov_frac"] = dropped
    return pg, metrics


def policy_loss(cfg, *, log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                weights: torch.Tensor, metric_weights: torch.Tensor, old_log_probs: torch.Tensor | None = None,
                ref_log_probs: torch.Tensor | None = None, rollout_log_probs: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(sum(weights * per-token loss), metrics as sum(metric_weights * x)) for one micro-batch.
    `cfg` is an AlgorithmConfig. old_log_probs None: the current policy detached (exact on the first
    step after generation)."""
    mask = mask.float()
    old = log_probs.detach() if old_log_probs is None else old_log_probs
    pg, metrics = _policy_gradient_term(cfg, log_probs, old, advantages, mask)
    metrics["ppo_kl"] = (old - log_probs).detach()
    if rollout_log_probs is not None:  # train-inference mismatch, every step: the engine vs the trainer
        delta = old.detach() - rollout_log_probs
        metrics.update(rollout_logprob_abs_diff=delta.abs(),
                       mismatch_kl=torch.exp(delta.clamp(max=LOG_RATIO_MAX)) - 1 - delta)  # k3 of KL(rollout || train)
    if cfg.use_rs:
        if rollout_log_probs is None:
            raise ValueError("--use-rs needs the rollout log-probs of every sample")
        keep = rejection_mask(old, rollout_log_probs, mask, cfg.rs_lower_bound, cfg.rs_upper_bound, cfg.rs_level)
        metrics["rs_masked_frac"] = 1 - keep
        pg = pg * keep
    if cfg.use_tis:
        if rollout_log_probs is None:
            raise ValueError("--use-tis needs the rollout log-probs of every sample")
        if cfg.custom_tis_function_path:  # slime's contract (algorithms/slime_contracts.py)
            pg, kept, tis_metrics = custom_tis(cfg, pg, old, rollout_log_probs, mask)
            metrics.update(tis_metrics)
            pg = pg * kept
        else:
            off_policy, capped = tis_weights(old, rollout_log_probs, cfg.tis_clip, cfg.tis_clip_low, mask, cfg.tis_level)
            metrics.update(tis_weight=off_policy, tis_clipfrac=capped)
            pg = pg * off_policy
    elif cfg.decoupled_ppo:
        if rollout_log_probs is None or old_log_probs is None:
            raise ValueError("--decoupled-ppo needs rollout log-probs and recomputed proximal log-probs")
        off_policy, dropped = behaviour_weights(old, rollout_log_probs, cfg.behav_imp_weight_cap)
        metrics.update(behav_weight=off_policy, behav_dropped_frac=dropped)
        pg = pg * off_policy
    metrics["pg_loss"] = pg.detach()
    total = pg
    if cfg.kl_loss_coef != 0:
        if ref_log_probs is None:
            raise ValueError("--kl-loss-coef needs reference log-probs")
        kl = kl_estimate(log_probs, ref_log_probs, cfg.kl_loss_type)
        metrics["kl_loss"] = kl.detach()
        total = total + cfg.kl_loss_coef * kl
    if entropy is not None:
        metrics["entropy"] = entropy.detach()
        if cfg.entropy_coef != 0:
            total = total - cfg.entropy_coef * entropy
    loss = (weights * total).sum()
    return loss, {name: (metric_weights * value.float()).sum().detach() for name, value in metrics.items()}


def sft_loss(cfg, *, log_probs: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
             metric_weights: torch.Tensor, **unused: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """--loss-type sft_loss: the negative log-likelihood of the trained tokens, sum(weights * -log p) for
    one micro-batch (weights: --loss-agg-mode over the mask, as the policy loss). Takes the policy loss's
    inputs; advantages, old / reference / rollout log-probs and entropy are not used."""
    nll = -log_probs * mask.float()
    return (weights * nll).sum(), {"sft_loss": (metric_weights * nll).sum().detach()}
