"""On-policy distillation (OPD): the student learns from the teacher's view of the student's own
samples (--use-opd; the teacher's scoring is rollout/distillation.py). The signal is the reverse KL,
KL(student || teacher), at every response token t, in one of two forms (--opd-estimator).

topk (default): the teacher's K likeliest tokens S_t at t and their log-probs come from SGLang
(top_logprobs_num). The student's distribution and the teacher's are coarse-grained onto S_t plus one
tail bucket (everything else), and the loss takes the exact reverse KL between the two:

    KL_t = sum_{v in S_t} p_s(v) (log p_s(v) - log p_t(v)) + p_s(tail) (log p_s(tail) - log p_t(tail))
    p(tail) = 1 - sum_{v in S_t} p(v)

By the data-processing inequality it is a lower bound of the full reverse KL, exact when S_t holds all
of the teacher's mass. It is a loss term, differentiated through p_s: every token of S_t gets the
gradient, not only the one sampled, so a student learns where a peaked teacher puts its mass
instead of being pushed, token by sampled token, onto one of its modes.

sampled (slime's form): k1 = log p_student(y_t) - log p_teacher(y_t) on the sampled token only,
a per-token penalty on the advantage, after whatever estimator made it (so it adds to any estimator,
or stands alone when every task reward is 0):

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


TAIL_FLOOR = 1e-8  # p(tail) is clamped to this: S_t may hold (to rounding) all the mass


def topk_reverse_kl(student_top_log_probs: torch.Tensor, teacher_top_log_probs: torch.Tensor) -> torch.Tensor:
    """KL_t above, per token: [..., K] the student's and the teacher's log-probs of the teacher's top-K
    tokens -> [...]. Differentiable in the student's log-probs; finite for any input (padding
    positions, whose log-probs are 0, give finite values that their zero loss weight removes)."""
    student, teacher = student_top_log_probs, teacher_top_log_probs.detach()
    p_student = student.exp()
    in_top = (p_student * (student - teacher)).sum(-1)
    tail_student = (1 - p_student.sum(-1)).clamp(min=TAIL_FLOOR)
    tail_teacher = (1 - teacher.exp().sum(-1)).clamp(min=TAIL_FLOOR)
    return in_top + tail_student * (tail_student.log() - tail_teacher.log())
