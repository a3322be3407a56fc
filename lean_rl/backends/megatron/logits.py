"""Full-vocabulary logits of whole sequences, forward-only through Megatron's pipeline schedule (any
TP / PP / EP layout): for parity checks against transformers (checkpoint conversion, debugging).
Training and scoring use logprobs.py, which never gathers the vocab dimension."""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region


def forward_logits(model: torch.nn.Module, token_ids: list[list[int]], vocab_size: int,
                   device: torch.device) -> list[torch.Tensor] | None:
    """float32 [len, vocab_size] logits per sequence (padded vocab columns dropped), one sequence per
    forward; on the last pipeline stage, None elsewhere. Every rank of the model calls it together."""
    was_training = model.training
    model.eval()
    results = []
    try:
        for tokens in token_ids:
            batch = torch.tensor([tokens], dtype=torch.long, device=device)
            positions = torch.arange(len(tokens), device=device).unsqueeze(0)

            def collect(output: torch.Tensor, non_loss_data: bool = True) -> torch.Tensor:
                # [b, s, V/tp] -> all-gather over TP along the vocab dim -> real vocab columns
                full = gather_from_tensor_model_parallel_region(output)
                return full[0, :, :vocab_size].float().cpu()

            def forward_step(data_iterator, step_model):
                return step_model(batch, positions, attention_mask=None), collect

            with torch.no_grad():
                out = get_forward_backward_func()(
                    forward_step_func=forward_step, data_iterator=iter([None]), model=[model], num_microbatches=1,
                    seq_length=len(tokens), micro_batch_size=1, forward_only=True, collect_non_loss_data=True)
            if parallel_state.is_pipeline_last_stage():
                results.append(out[0])
    finally:
        model.train(was_training)
    return results if parallel_state.is_pipeline_last_stage() else None
