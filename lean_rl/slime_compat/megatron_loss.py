"""slime.backends.megatron_utils.loss: what a slime custom loss imports from slime's trainer.

`get_log_probs_and_entropy(logits, ...)` hands out the per-sample response log-probs (and entropy)
that lean_rl's trainer computed for this micro-batch: the `logits` a slime loss receives from lean_rl
is a TrainerLogits (lean_rl/algorithms/slime_contracts.py), not Megatron's packed tensor, so the
other arguments (tokens, lengths, chunking) are not needed and are ignored."""

from __future__ import annotations

import torch

from lean_rl.algorithms.slime_contracts import TrainerLogits

__all__ = ["get_log_probs_and_entropy"]


def get_log_probs_and_entropy(logits: TrainerLogits, *, args=None, unconcat_tokens=None, total_lengths=None,
                              response_lengths=None, with_entropy: bool = False, **unused) -> dict[str, list[torch.Tensor]]:
    if not isinstance(logits, TrainerLogits):
        raise TypeError("get_log_probs_and_entropy: lean_rl serves it for the `logits` its trainer hands to a slime "
                        f"loss (--custom-loss-function-path), got {type(logits).__name__}")
    out = {"log_probs": logits.log_probs}
    if with_entropy:
        if logits.entropy is None:
            raise ValueError("get_log_probs_and_entropy: the trainer computed no entropy for this micro-batch")
        out["entropy"] = logits.entropy
    return out
