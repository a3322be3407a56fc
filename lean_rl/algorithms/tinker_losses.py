"""Tinker's built-in losses, as its SDK defines them: sums over tokens (not means), on the log-probs
of arbitrary target tokens (position i predicts target_tokens[i]).

    cross_entropy        -sum w * logp                                     needs weights
    importance_sampling  -sum exp(logp - q) * A                            needs logprobs (q), advantages
    ppo                  -sum min(r A, clip(r, lo, hi) A),  r = exp(logp - q)
    cispo                -sum sg(clip(r, lo, hi)) * logp * A

lo / hi: loss_fn_config clip_low_threshold / clip_high_threshold (default 0.8 / 1.2). `mask` is 1 on a
datum's real positions and 0 on padding."""

from __future__ import annotations

import torch

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
_NEEDS = {"cross_entropy": ("weights",), "importance_sampling": ("logprobs", "advantages"),
          "ppo": ("logprobs", "advantages"), "cispo": ("logprobs", "advantages")}
_CONFIG = {"cross_entropy": (), "importance_sampling": (),
           "ppo": ("clip_low_threshold", "clip_high_threshold"), "cispo": ("clip_low_threshold", "clip_high_threshold")}


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


def tinker_loss(name: str, logp: torch.Tensor, inputs: dict[str, torch.Tensor], mask: torch.Tensor,
                config: dict[str, float]) -> torch.Tensor:
    """The summed loss (a scalar) of log-probs `logp` [n, L] with the datums' `inputs` (each [n, L])."""
    if name == "cross_entropy":
        return -(inputs["weights"] * logp * mask).sum()
    advantages = inputs["advantages"] * mask
    ratio = torch.exp(logp - inputs["logprobs"]) * mask
    if name == "importance_sampling":
        return -(ratio * advantages).sum()
    clipped = ratio.clamp(config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2))
    if name == "ppo":
        return -torch.minimum(ratio * advantages, clipped * advantages).sum()
    if name == "cispo":
        return -(clipped.detach() * logp * advantages).sum()
    raise ValueError(f"loss_fn {name!r} is not supported")
