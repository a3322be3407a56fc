"""Losses on preference pairs (a prompt, a chosen and a rejected response): DPO and its variants on
the policy's log-probs, and the Bradley-Terry loss of a reward model's scores.

DPO (Rafailov et al. 2023), with pi the policy, ref the frozen reference, and per sequence
    h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))      (log p of a response: sum over its tokens)
    sigmoid       -log sigmoid(beta h) (1 - eps) - log sigmoid(-beta h) eps    (eps: --dpo-label-smoothing, cDPO)
    hinge         max(0, 1 - beta h)                                            (SLiC)
    ipo           (h - 1 / (2 beta))^2, log p the mean over the response's tokens (IPO eq. 17, as TRL takes it)
    sigmoid_norm  sigmoid's loss with log p the mean over the response's tokens (length-normalised DPO)
Bradley-Terry (a reward model r): -log sigmoid(r(x, y_c) - r(x, y_r)).
The loss of a step is the mean over its pairs.

How the trainer takes them (engine-less, per row): each sequence's gradient coefficient
c_i = d(mean pair loss)/d(s_i), s_i its summed log-prob (DPO) or its score (reward model), is computed
here from a forward pass at the step's weights, and the ranks minimise sum_i c_i s_i (c_i detached).
Its gradient is exactly the pair loss's at those weights, whatever micro-batch or data-parallel rank
each sequence of a pair lands on; so one optimizer step per rollout of pairs (the config checks it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lean_rl.algorithms.names import DPO_LOSS_TYPES

# the variants whose log p is the mean over the response's tokens instead of the sum
LENGTH_NORMALISED = ("ipo", "sigmoid_norm")


def dpo_pair_losses(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                    ref_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid",
                    label_smoothing: float = 0.0) -> torch.Tensor:
    """[P] losses from [P] sequence log-probs (already length-normalised for ipo / sigmoid_norm)."""
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    if loss_type in ("sigmoid", "sigmoid_norm"):
        return -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing
    if loss_type == "hinge":
        return torch.relu(1 - beta * h)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    raise ValueError(f"--dpo-loss-type {loss_type!r}: choose one of {', '.join(DPO_LOSS_TYPES)}")


def bradley_terry_losses(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """[P] reward-model losses -log sigmoid(r_c - r_r)."""
    return -F.logsigmoid(chosen_scores - rejected_scores)


def pair_rows(group_ids: torch.Tensor, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen rows [P], rejected rows [P]) of a batch whose groups are pairs: each group two rows, the
    chosen one with reward 1 and the rejected one with reward 0 (rollout/preference.py makes them so)."""
    chosen, rejected = [], []
    for group in torch.unique(group_ids).tolist():
        rows = torch.nonzero(group_ids == group).flatten().tolist()
        marks = sorted(float(rewards[r]) for r in rows)
        if len(rows) != 2 or marks != [0.0, 1.0]:
            raise ValueError(f"group {group}: a preference pair is two samples, the chosen one with reward 1 "
                             f"and the rejected one with reward 0; got {len(rows)} samples with rewards {marks}")
        first, second = rows
        chosen.append(first if rewards[first] == 1 else second)
        rejected.append(second if rewards[first] == 1 else first)
    return torch.tensor(chosen, dtype=torch.long), torch.tensor(rejected, dtype=torch.long)


def sequence_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor, mean: bool) -> torch.Tensor:
    """[B] sum (mean: average) over each row's trained tokens of [B, T] log-probs."""
    mask = mask.float()
    total = (token_log_probs * mask).sum(dim=-1)
    return total / mask.sum(dim=-1).clamp(min=1) if mean else total


def dpo_coefficients(policy: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor,
                     rewards: torch.Tensor, beta: float, loss_type: str, label_smoothing: float = 0.0
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """([B] coefficient of each row's summed log-prob, metrics) for DPO on a batch of pairs: the
    gradient of the mean pair loss with respect to each row's sum of token log-probs of `policy`
    [B, T] (the step's weights), `reference` [B, T] the frozen model's. Metrics: the loss, the implicit
    rewards beta (log pi - log ref) of chosen and rejected, their margin and how often it is > 0."""
    chosen, rejected = pair_rows(group_ids, rewards)
    mean = loss_type in LENGTH_NORMALISED
    sums = sequence_log_probs(policy.detach().float(), mask, mean=False).requires_grad_(True)
    lengths = mask.float().sum(dim=-1).clamp(min=1)
    seq = sums / lengths if mean else sums
    ref = sequence_log_probs(reference.float(), mask, mean)
    losses = dpo_pair_losses(seq[chosen], seq[rejected], ref[chosen], ref[rejected], beta, loss_type, label_smoothing)
    (coefficients,) = torch.autograd.grad(losses.mean(), sums)
    with torch.no_grad():
        chosen_rewards = beta * (seq[chosen] - ref[chosen])
        rejected_rewards = beta * (seq[rejected] - ref[rejected])
        margins = chosen_rewards - rejected_rewards
    return coefficients.detach(), {"loss": float(losses.mean().detach()), "chosen_reward": float(chosen_rewards.mean()),
                                   "rejected_reward": float(rejected_rewards.mean()),
                                   "margin": float(margins.mean()), "accuracy": float((margins > 0).float().mean())}


def bradley_terry_coefficients(scores: torch.Tensor, group_ids: torch.Tensor, rewards: torch.Tensor
                               ) -> tuple[torch.Tensor, dict[str, float]]:
    """([B] coefficient of each row's score, metrics) for a reward model on a batch of pairs: the
    gradient of the mean Bradley-Terry loss with respect to each row's score [B] (at the step's
    weights). Metrics: the loss, the mean chosen and rejected scores, their margin and accuracy."""
    chosen, rejected = pair_rows(group_ids, rewards)
    leaf = scores.detach().float().clone().requires_grad_(True)
    losses = bradley_terry_losses(leaf[chosen], leaf[rejected])
    (coefficients,) = torch.autograd.grad(losses.mean(), leaf)
    margins = (leaf[chosen] - leaf[rejected]).detach()
    return coefficients.detach(), {"loss": float(losses.mean().detach()), "chosen_score": float(leaf[chosen].detach().mean()),
                                   "rejected_score": float(leaf[rejected].detach().mean()), "margin": float(margins.mean()),
                                   "accuracy": float((margins > 0).float().mean())}


def pairwise_loss(cfg, *, log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  **unused: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """--loss-type dpo_loss / rm_loss on one micro-batch: sum over rows of c_i * s_i, where `advantages`
    carries -c_i on every trained token of row i and `log_probs` the per-token log-probs (DPO: s_i their
    sum) or the row's score on its one trained token (reward model). The coefficients are normalised
    over the whole step by the driver, so micro-batches and ranks add up to the step's mean pair loss's
    gradient. The step's real loss and margins are reported by the driver (train/dpo_*, train/rm_*)."""
    surrogate = -(advantages * log_probs * mask.float()).sum()
    return surrogate, {}


def pairwise_advantages(algo, current: torch.Tensor | None, reference: torch.Tensor | None, mask: torch.Tensor,
                        group_ids: torch.Tensor, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """([B, T] what pairwise_loss takes as `advantages`: -c_i on row i's trained tokens, the step's metrics
    named train/dpo_* or train/rm_*, and train/loss the pair loss) for --loss-type dpo_loss (`current` [B, T] the policy's log-probs at
    the step's weights, `reference` the frozen model's) or rm_loss (`current` [B, T] the value head's
    output, the score on each row's one trained token)."""
    if current is None:
        raise ValueError(f"--loss-type {algo.loss_type} needs a forward pass at the step's weights")
    if algo.loss_type == "dpo_loss":
        if reference is None:
            raise ValueError("--loss-type dpo_loss needs the reference model's log-probs")
        coefficients, metrics = dpo_coefficients(current, reference, mask, group_ids, rewards, algo.dpo_beta,
                                                 algo.dpo_loss_type, algo.dpo_label_smoothing)
        prefix = "train/dpo_"
    else:
        scores = sequence_log_probs(current, mask, mean=False)  # the one trained position's value
        coefficients, metrics = bradley_terry_coefficients(scores, group_ids, rewards)
        prefix = "train/rm_"
    advantages = -coefficients.reshape(-1, 1) * mask.float()
    return advantages, {"train/loss": metrics["loss"], **{prefix + name: value for name, value in metrics.items()}}
