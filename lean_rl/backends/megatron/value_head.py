"""The PPO critic: the policy's GPTModel with its vocabulary output layer replaced by a scalar value
head (hidden -> 1), so it starts from the same pretrained trunk.

The head's weight is replicated over TP ranks. Without sequence parallel every TP rank sees the same
hidden states, computes the same values and the same weight gradient, and passes the full gradient
back into the (replicated) hidden states, as Megatron's own replicated tensors do. Under sequence
parallel each rank holds a slice of the sequence: values are gathered (backward: each rank keeps
its slice of the gradient), and the weight is tagged `sequence_parallel` so finalize_model_grads
sums its partial gradients over TP (finalize_model_grads.py:354)."""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer.module import MegatronModule


class ValueHead(MegatronModule):
    def __init__(self, config):
        super().__init__(config=config)
        self.sequence_parallel = config.sequence_parallel
        # zeros: identical on every TP rank without a broadcast; the critic starts at V = 0
        self.weight = torch.nn.Parameter(torch.zeros(1, config.hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """Stored as `value_head.weight`, not under the output layer's name, which checkpoint loading
        and conversion read as the vocabulary projection (a [1, hidden] one would fail their vocab
        checks); the state-dict name stays, so load_state_dict finds the parameter."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        for item in sharded.values():
            item.key = item.key.replace("output_layer.", "value_head.", 1)
        return sharded

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        """Called where GPTModel calls its output layer: [s(/tp), b, h] -> ([s, b, 1], None)."""
        values = torch.matmul(hidden_states, self.weight.t().to(hidden_states.dtype))
        if self.sequence_parallel:
            values = gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None


def attach_value_head(model: torch.nn.Module) -> torch.nn.Module:
    """Turn this rank's stage of a GPTModel into a critic stage (in place; before wrapping in DDP)."""
    if model.post_process:
        model.output_layer = ValueHead(model.config).to(next(model.parameters()).device)
    # No stage shares the word embeddings with an output layer any more (finalize_model_grads would
    # otherwise all-reduce embedding grads between the first and last stage).
    model.share_embeddings_and_output_weights = False
    return model
