"""Advantage estimators. Inputs are the whole rollout (the driver has it): sequence rewards [B], the
prompt group of each sequence [B], response-aligned [B, T] tensors (T = longest response) with a
mask that is 1 on tokens the loss trains, and `valid` [B]: False for a FAILED sample (generation or
reward failed for infrastructure reasons; its reward means nothing).

    grpo                   A_i = (r_i - mean_g) / (std_g + eps)          (DeepSeekMath; std unbiased)
    dr_grpo                A_i = r_i - mean_g                            (Dr. GRPO: no std division)
    gspo                   same as grpo (the loss differs: sequence-level ratio)
    rloo                   A_i = r_i - mean_{j != i in g} r_j            (leave-one-out baseline)
    cispo                  same as grpo (the loss differs: CISPO, slime's name)
    opo                    A_i = r_i - sum_g(l_j r_j) / sum_g(l_j), l_j the number of trained tokens of
                           response j (OPO, Hao et al. 2025: the length-weighted optimal baseline)
    remax                  A_i = r_i - r_greedy(g), the reward of the prompt's greedy (temperature 0)
                           response, generated and scored by the rollout but not trained (ReMax,
                           Li et al. 2023; verl's remax); no whitening unless --normalize-advantages
    pass_at_k              rewards 0/1; a group of n with c correct, pass@k estimate R = 1 - C(n-c, k) / C(n, k),
                           std = sqrt(R (1 - R)):  correct  A = (1 - R) / (std + eps)
                           incorrect  A = (1 - R - C(n-c-1, k-1) / C(n-1, k-1)) / (std + eps)
                           (Pass@k Training, Chen et al., arXiv 2508.10751, the analytical form: each
                           sample's advantage averaged over the k-subsets holding it); k = min(--pass-k, n)
    reinforce_plus_plus    token rewards -kl_coef * kl_t, + r_i on the last policy token,
                           discounted returns G_t, whitened over the batch
    reinforce_plus_plus_baseline   (r_i - mean_g) - kl_coef * kl_t, whitened over the batch
    ppo                    GAE(gamma, lambda) on the same token rewards with critic values

Sequence advantages are broadcast to every token of the response. Tokens with mask 0 inside a
response (tool output) are not time steps: returns and GAE pass through them unchanged.

Failed samples are not data: a group g is its valid members only (mean_g, std_g, the leave-one-out
mean and the group size n_g are taken over them), the batch whitening sees only valid tokens, and a
failed sample's advantage (and PPO return) is 0 on every token. So a group [1, 0, FAILED, 1] gives
its three valid members exactly the advantages of the group [1, 0, 1]. A group of one valid member
has no baseline: mean 0 and std 1 (verl's convention), so A = r, as a group of one sequence; a group
of none trains nothing. The token-level estimators (reinforce_plus_plus, ppo) use no group: for
them a failed sample only leaves the batch whitening."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lean_rl.algorithms.names import ESTIMATORS, KL_IN_REWARD_ESTIMATORS, RAW_REWARD_ESTIMATORS
from lean_rl.algorithms.token_returns import broadcast, gae, last_token_rewards, masked_whiten, reinforce_plus_plus
from lean_rl.sample import REMAX_BASELINE_REWARD

GROUP_EPS = 1e-6


@dataclass(frozen=True)
class AdvantageInputs:
    """One rollout, as the advantage estimator sees it: B sequences, per-token tensors [B, T]
    response-aligned (row i: sequence i's response tokens from column 0, zero-padded to the longest)."""

    rewards: torch.Tensor  # [B] float32: the trained reward (after --custom-reward-post-process-path)
    group_ids: torch.Tensor  # [B] int64: the prompt group of each sequence
    mask: torch.Tensor  # [B, T] float32: 1 on trained tokens; 0 on padding, tool tokens, FAILED samples
    valid: torch.Tensor  # [B] bool: False for a FAILED sample (keep it out of every statistic)
    rollout_log_probs: torch.Tensor  # [B, T]: the engine's log-probs of the sampled tokens
    old_log_probs: torch.Tensor | None = None  # [B, T]: recomputed (or the rollout's) when the step needs them
    ref_log_probs: torch.Tensor | None = None  # [B, T]: the reference model's, when a KL term needs them
    values: torch.Tensor | None = None  # [B, T]: the critic's (--advantage-estimator ppo)
    kl: torch.Tensor | None = None  # [B, T]: k1 KL(old || ref) per token, when --kl-coef != 0
    # [B] float32: the reward of each sequence's prompt's greedy response (--advantage-estimator remax;
    # sample.metadata["remax_baseline_reward"]), NaN where the rollout gave none
    baseline_rewards: torch.Tensor | None = None
    # [B] int64: each sequence's response length and prompt + response length (slime's contract reads them)
    response_lengths: torch.Tensor | None = None
    total_lengths: torch.Tensor | None = None


def _all_valid(rewards: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return torch.ones(rewards.shape[0], dtype=torch.bool) if valid is None else valid.bool()


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor,
                 valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sequence: (size, mean, unbiased std) of the valid members of its group (size 0: mean 0)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    weight = valid.double()
    rewards = torch.where(valid, rewards.double(), 0.0)  # a failed reward (even NaN) reaches no statistic

    def per_group(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, values)

    size = per_group(weight)
    mean = per_group(rewards) / size.clamp(min=1)
    squares = per_group(weight * (rewards - mean[inverse]) ** 2)
    std = (squares / (size - 1).clamp(min=1)).sqrt()
    return size[inverse], mean[inverse], std[inverse]


def group_normalized(rewards: torch.Tensor, group_ids: torch.Tensor, *, divide_by_std: bool,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO (divide_by_std) and Dr. GRPO sequence advantages [B] over the valid members of each
    group; 0 for invalid (FAILED) sequences."""
    valid = _all_valid(rewards, valid)
    size, mean, std = _group_stats(rewards, group_ids, valid)
    single = size <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    advantages = rewards.double() - mean
    if divide_by_std:
        std = torch.where(single, torch.ones_like(std), std)
        advantages = advantages / (std + GROUP_EPS)
    return torch.where(valid, advantages, 0.0).float()


def leave_one_out(rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """RLOO: r_i minus the mean of the other valid members of its group (= n/(n-1) (r_i - mean_g));
    0 for invalid (FAILED) sequences."""
    valid = _all_valid(rewards, valid)
    size, mean, _ = _group_stats(rewards, group_ids, valid)
    others = (mean * size - rewards.double()) / (size - 1).clamp(min=1)
    baseline = torch.where(size <= 1, torch.zeros_like(others), others)
    return torch.where(valid, rewards.double() - baseline, 0.0).float()


def length_weighted_baseline(rewards: torch.Tensor, group_ids: torch.Tensor, lengths: torch.Tensor,
                             valid: torch.Tensor | None = None) -> torch.Tensor:
    """OPO: r_i minus the length-weighted mean reward sum(l_j r_j) / sum(l_j) of the valid members of its
    group (no baseline for a group of one, as grpo); 0 for invalid (FAILED) sequences."""
    valid = _all_valid(rewards, valid)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    rewards = torch.where(valid, rewards.double(), 0.0)
    lengths = torch.where(valid, lengths.double(), 0.0)

    def per_group(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, values)[inverse]

    baseline = per_group(lengths * rewards) / per_group(lengths).clamp(min=1e-12)
    baseline = torch.where(per_group(valid.double()) <= 1, torch.zeros_like(baseline), baseline)
    return torch.where(valid, rewards - baseline, 0.0).float()


def greedy_baseline(rewards: torch.Tensor, baselines: torch.Tensor | None,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
    """ReMax: r_i minus its prompt's greedy-response reward b_i ([B], NaN where the rollout gave none);
    0 for invalid (FAILED) sequences. A valid sequence without a baseline is an error: it cannot be
    trained correctly."""
    valid = _all_valid(rewards, valid)
    missing = valid if baselines is None else valid & torch.isnan(baselines.double())
    if bool(missing.any()):
        rows = torch.nonzero(missing).squeeze(-1).tolist()
        raise ValueError(f"--advantage-estimator remax needs the reward of each prompt's greedy response in "
                         f"sample.metadata[{REMAX_BASELINE_REWARD!r}]; {len(rows)} sample(s) of the batch (rows "
                         f"{rows[:8]}) have none. The default rollout sets it; a custom --rollout-function-path "
                         "must set it on every sample of a group")
    return torch.where(valid, rewards.double() - torch.where(valid, baselines.double(), 0.0), 0.0).float()


def pass_at_k_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, k: int,
                         valid: torch.Tensor | None = None) -> torch.Tensor:
    """Pass@k Training's analytical advantages (see the module docstring) over the valid members of
    each group; rewards must be 0 or 1; 0 for invalid (FAILED) sequences."""
    if k < 1:
        raise ValueError(f"--pass-k must be >= 1, got {k}")
    valid = _all_valid(rewards, valid)
    binary = (rewards[valid] == 0) | (rewards[valid] == 1)
    if not bool(binary.all()):
        raise ValueError("--advantage-estimator pass_at_k needs rewards of 0 or 1, got "
                         f"{sorted(set(rewards[valid][~binary].tolist()))[:5]}")
    size, mean, _ = _group_stats(rewards, group_ids, valid)
    out = torch.zeros(rewards.shape[0], dtype=torch.float64)
    for i in torch.nonzero(valid).squeeze(-1).tolist():
        n = int(size[i])
        wrong = n - round(float(mean[i]) * n)
        kk = min(k, n)
        group_pass = 1 - math.comb(wrong, kk) / math.comb(n, kk)
        std = math.sqrt(group_pass * (1 - group_pass))
        if rewards[i] == 1:
            out[i] = (1 - group_pass) / (std + GROUP_EPS)
        else:  # the k-subsets holding this wrong sample fail when its k - 1 companions are all wrong too
            out[i] = (1 - group_pass - math.comb(wrong - 1, kk - 1) / math.comb(n - 1, kk - 1)) / (std + GROUP_EPS)
    return out.float()


def reinforce_plus_plus_baseline(rewards: torch.Tensor, group_ids: torch.Tensor, kl: torch.Tensor,
                                 mask: torch.Tensor, kl_coef: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    centred = group_normalized(rewards, group_ids, divide_by_std=False, valid=valid)
    return masked_whiten(broadcast(centred, mask) - kl_coef * kl * mask.float(), mask)


def compute_advantages(estimator: str, rewards: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor, *,
                       valid: torch.Tensor | None = None, kl: torch.Tensor | None = None, kl_coef: float = 0.0,
                       values: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                       normalize: bool = False, pass_k: int | None = None,
                       baselines: torch.Tensor | None = None,
                       group_baseline: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages [B, T], returns [B, T] for the critic or None). `valid` ([B] bool, default all)
    marks the sequences that are data: the others (FAILED samples) are left out of every group and
    batch statistic and get advantage 0 (see the module docstring). `kl` ([B, T], old policy vs
    reference) is the KL-in-reward term of the token-level estimators (REINFORCE++ variants, PPO);
    the group estimators take KL as a loss term instead. `normalize` whitens the result over the batch
    (--normalize-advantages; REINFORCE++ variants are always whitened). `pass_k`: the k of pass_at_k.
    `baselines` ([B], NaN where absent): remax's greedy-response reward of each sequence's prompt.
    `group_baseline` False (--disable-rewards-normalization, slime's flag): the group estimators (grpo, dr_grpo,
    gspo, cispo, reinforce_plus_plus_baseline) take the raw reward, no group mean or std."""
    if kl_coef != 0 and kl is None:
        raise ValueError("kl_coef != 0 needs per-token kl")
    if kl_coef != 0 and estimator not in KL_IN_REWARD_ESTIMATORS:
        raise ValueError(f"--kl-coef (KL in the reward) applies to {', '.join(KL_IN_REWARD_ESTIMATORS)}; "
                         f"with --advantage-estimator {estimator} use --kl-loss-coef")
    valid = _all_valid(rewards, valid)
    mask = mask.float() * valid.unsqueeze(-1)  # from here on a failed sample has no token
    kl = torch.zeros_like(mask) if kl is None else kl.float()
    returns = None
    if not group_baseline and estimator in RAW_REWARD_ESTIMATORS:
        raw = torch.where(valid, rewards.float(), 0.0)
        if estimator == "reinforce_plus_plus_baseline":
            return masked_whiten(broadcast(raw, mask) - kl_coef * kl * mask, mask), None
        advantages = broadcast(raw, mask)
    elif estimator in ("grpo", "gspo", "cispo"):
        advantages = broadcast(group_normalized(rewards, group_ids, divide_by_std=True, valid=valid), mask)
    elif estimator == "dr_grpo":
        advantages = broadcast(group_normalized(rewards, group_ids, divide_by_std=False, valid=valid), mask)
    elif estimator == "rloo":
        advantages = broadcast(leave_one_out(rewards, group_ids, valid), mask)
    elif estimator == "opo":
        advantages = broadcast(length_weighted_baseline(rewards, group_ids, mask.sum(-1), valid), mask)
    elif estimator == "remax":
        advantages = broadcast(greedy_baseline(rewards, baselines, valid), mask)
    elif estimator == "pass_at_k":
        if pass_k is None:
            raise ValueError("--advantage-estimator pass_at_k needs --pass-k")
        advantages = broadcast(pass_at_k_advantages(rewards, group_ids, pass_k, valid), mask)
    elif estimator == "reinforce_plus_plus":
        return reinforce_plus_plus(rewards, kl, mask, kl_coef, gamma), None
    elif estimator == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline(rewards, group_ids, kl, mask, kl_coef, valid), None
    elif estimator == "ppo":
        if values is None:
            raise ValueError("--advantage-estimator ppo needs critic values")
        token_rewards = -kl_coef * kl * mask + last_token_rewards(rewards, mask)
        advantages, returns = gae(token_rewards, values.float(), mask, gamma, lam)
    else:
        raise ValueError(f"--advantage-estimator {estimator!r}: choose one of {', '.join(ESTIMATORS)}")
    if normalize:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns
