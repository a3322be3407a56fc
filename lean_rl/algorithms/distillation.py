"""On-policy distillation (OPD): the student learns from a teacher's per-token log-probs of the
student's own samples (--use-opd; the teacher's scoring is rollout/distillation.py).

The signal is the reverse KL, KL(student || teacher), estimated on each sampled token by
k1 = log p_student(y_t) - log p_teacher(y_t). It enters as a per-token penalty on the advantage,
after whatever estimator made it (slime's form, so it adds to any estimator, or stands alone when
every task reward is 0):

    A_t <- A_t - opd_kl_coef * (log p_student(y_t) - log p_teacher(y_t))

Minimising the policy loss with this advantage follows the gradient of the reverse KL on the
student's own distribution: tokens the teacher finds likelier than the student are pushed up,
the others down."""

from __future__ import annotations

import torch


def reverse_kl_advantages(advantages: torch.Tensor, student_log_probs: torch.Tensor,
                          teacher_log_probs: torch.Tensor, mask: torch.Tensor,
                          kl_coef: float) -> tuple[torch.Tensor, float]:
    """(advantages with the OPD penalty, the masked mean of k1 = student - teacher over the trained
    tokens: the estimate of KL(student || teacher) that `train/opd_reverse_kl` logs). All [B, T]
    response-aligned; positions where `mask` is 0 keep their advantage."""
    reverse_kl = (student_log_probs - teacher_log_probs) * mask
    mean_kl = float(reverse_kl.sum() / mask.sum().clamp(min=1))
    return advantages - kl_coef * reverse_kl, mean_kl
