"""Tinker's built-in losses, as its SDK defines them: sums over tokens (not means), on the log-probs
of arbitrary target tokens (position i predicts target_tokens[i]).

    cross_entropy        -sum w * logp                                     needs weights
    importance_sampling  -sum exp(logp - q) * A                            needs logprobs (q), advantages
    ppo                  -sum min(r A, clip(r, lo, hi) A),  r = exp(logp - q)
    cispo                -sum sg(clip(r, lo, hi)) * logp * A
    dro                  -sum (logp * A - beta / 2 * (logp - q)^2)
    gspo                 ppo with every token's ratio s_t = sg(s) * exp(logp - sg(logp)), s the datum's
                         geometric-mean ratio exp(mean(logp - q)) over the tokens sequence_ratio_mask marks

lo / hi: loss_fn_config clip_low_threshold / clip_high_threshold (ppo, cispo: default 0.8 / 1.2). Tinker
documents dro's `beta` and gspo's thresholds without their defaults, so this server takes them only
as given (a request without them is refused, naming the key). `mask` is 1 on a datum's real positions
and 0 on padding; a row of the [n, L] tensors is one datum."""

from __future__ import annotations

import torch

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo")
_POLICY = ("logprobs", "advantages")
_CLIP = ("clip_low_threshold", "clip_high_threshold")
_NEEDS = {"cross_entropy": ("weights",), "importance_sampling": _POLICY, "ppo": _POLICY, "cispo": _POLICY,
          "dro": _POLICY, "gspo": (*_POLICY, "sequence_ratio_mask")}
_CONFIG = {"cross_entropy": (), "importance_sampling": (), "ppo": _CLIP, "cispo": _CLIP, "dro": ("beta",),
           "gspo": _CLIP}
_REQUIRED_CONFIG = {"dro": ("beta",), "gspo": _CLIP}


def check_loss(name: str, input_names: set[str], config: dict[str, float]) -> None:
    """ValueError naming what is wrong with a request's loss, its inputs or its config."""
    if name not in LOSSES:
        raise ValueError(f"loss_fn {name!r} is not supported by this server (supported: {', '.join(LOSSES)})")
    missing = [n for n in _NEEDS[name] if n not in input_names]
    if missing:
        raise ValueError(f"loss_fn {name}: loss_fn_inputs lacks {', '.join(missing)}")
    unknown = sorted(set(config) - set(_CONFIG[name]))
    if unknown:
        raise ValueError(f"loss_fn {name}: loss_fn_config {', '.join(unknown)} is not supported "
                         f"(takes: {', '.join(_CONFIG[name]) or 'nothing'})")
    absent = [k for k in _REQUIRED_CONFIG.get(name, ()) if k not in config]
    if absent:
        raise ValueError(f"loss_fn {name}: loss_fn_config needs {', '.join(absent)} (this server assumes no "
                         "default for it)")


def _clip(ratio: torch.Tensor, config: dict[str, float]) -> torch.Tensor:
    return ratio.clamp(config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2))


def _sequence_ratio(logp: torch.Tensor, q: torch.Tensor, in_ratio: torch.Tensor) -> torch.Tensor:
    """GSPO-token: each token carries its datum's sequence ratio as value, its own log-prob's gradient."""
    count = in_ratio.sum(dim=1, keepdim=True).clamp(min=1.0)
    log_ratio = ((logp.detach() - q) * in_ratio).sum(dim=1, keepdim=True) / count
    return torch.exp(log_ratio + logp - logp.detach())


def tinker_loss(name: str, logp: torch.Tensor, inputs: dict[str, torch.Tensor], mask: torch.Tensor,
                config: dict[str, float]) -> torch.Tensor:
    """The summed loss (a scalar) of log-probs `logp` [n, L] with the datums' `inputs` (each [n, L])."""
    if name == "cross_entropy":
        return -(inputs["weights"] * logp * mask).sum()
    advantages = inputs["advantages"] * mask
    if name == "dro":
        penalty = 0.5 * config["beta"] * (logp - inputs["logprobs"]) ** 2
        return -((logp * advantages - penalty) * mask).sum()
    if name == "gspo":
        ratio = _sequence_ratio(logp, inputs["logprobs"], (inputs["sequence_ratio_mask"] != 0) * mask) * mask
    else:
        ratio = torch.exp(logp - inputs["logprobs"]) * mask
    if name == "importance_sampling":
        return -(ratio * advantages).sum()
    clipped = _clip(ratio, config)
    if name in ("ppo", "gspo"):
        return -torch.minimum(ratio * advantages, clipped * advantages).sum()
    if name == "cispo":
        return -(clipped.detach() * logp * advantages).sum()
    raise ValueError(f"loss_fn {name!r} is not supported")
