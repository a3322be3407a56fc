"""Two hooks into a built Megatron GPTModel (any device), installed by the rank where a feature asks
for them: rollout routing replay (install_route_replay: each TopKRouter replays the engine's expert
choices) and chunked log-probs (hidden_states_from_output_layer: the output layer hands back its input).
Line numbers refer to megatron-core 0.16.1 (site-packages/megatron/core/...)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def install_route_replay(model: torch.nn.Module) -> int:
    """Give every TopKRouter of `model` a routing_replay.RouteReplay; returns how many.

    Megatron's own hook: TopKRouter.routing passes `self.router_replay` (router.py:583) to
    topk_routing_with_score_function, which asks it for the top-k (moe_utils.py:705
    `router_replay.get_replay_topk(scores, topk, num_groups, group_topk, _compute_topk)`). Megatron
    fills the attribute itself with moe_enable_routing_replay (router.py:205-207), but its REPLAY_FORWARD
    (router_replay.py:146-152) gathers the target indices as given: a token the engine has no route for
    (NO_ROUTE, -1) would index out of range, and it cannot report where its own choice would differ.
    So the config flag stays off and the attribute is set here, once, after the model is built. The
    fused router (moe_utils.py:652, TE) would ignore the hook: model.py leaves moe_router_fusion off."""
    from megatron.core.transformer.moe.router import TopKRouter

    from lean_rl.backends.megatron.routing_replay import RouteReplay

    count = 0
    for module in model.modules():
        if isinstance(module, TopKRouter):
            if module.layer_number is None:
                raise RuntimeError("a MoE router without its layer number: cannot tell which routes are its own")
            module.router_replay = RouteReplay(module.layer_number, bool(module.config.sequence_parallel))
            count += 1
    return count


# ---------------------------------------------------------------- chunked log-probs: the output layer hands
# back its input
@contextlib.contextmanager
def hidden_states_from_output_layer(model: torch.nn.Module) -> Iterator[None]:
    """Within the context, this rank's GPTModel returns its last hidden states [b, s, h] (after the
    final norm) where it returns logits [b, s, V/tp]: GPTModel._postprocess calls
    `self.output_layer(hidden_states, weight=output_weight, ...)` (gpt_model.py:685) and returns
    `logits.transpose(0, 1).contiguous()` (gpt_model.py:712) with no other use of them, so an output
    layer that returns its input makes the model's output the hidden states, and
    chunked_logprobs.py makes the logits a chunk at a time. The input goes through the same TP
    region ColumnParallelLinear puts it in (layers.py:244-251 and its linear function): gathered
    over the sequence under sequence parallel (backward: reduce-scatter), else replicated (backward:
    all-reduce), since each TP rank's gradient is that of its vocab shard only. The layer keeps its
    parameters, state-dict names and embedding tying; only this instance's forward is replaced, and
    restored on exit. A stage without the output layer (not the last) is left as it is."""
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    from lean_rl.backends.megatron.chunked_logprobs import unwrapped

    gpt = unwrapped(model)
    layer = getattr(gpt, "output_layer", None) if getattr(gpt, "post_process", False) else None
    if layer is None:
        yield
        return
    if gpt.config.mtp_num_layers:
        raise ValueError("--logits-chunk-size needs a model without multi-token prediction layers "
                         "(they call the output layer for their own loss); pass --logits-chunk-size 0")

    def hidden_states(input_: torch.Tensor, weight=None, runtime_gather_output=None):
        if layer.sequence_parallel:
            return gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=True), None
        if layer.allreduce_dgrad:
            return _SumGradientOverTensorParallel.apply(input_), None
        return input_, None

    layer.forward = hidden_states
    try:
        yield
    finally:
        del layer.forward


class _SumGradientOverTensorParallel(torch.autograd.Function):
    """Identity forward; backward: the gradient summed over the TP group. Megatron's own
    copy_to_tensor_model_parallel_region does this, but its _reduce (tensor_parallel/mappings.py:31)
    all-reduces `grad.contiguous()` and returns the original `grad`: a non-contiguous gradient (the
    one GPTModel's `transpose(0, 1).contiguous()` hands back to the hidden states, gpt_model.py:712)
    comes back unreduced, each rank keeping only its vocab shard's share. Here the reduced tensor is
    the one returned."""

    @staticmethod
    def forward(ctx, input_: torch.Tensor) -> torch.Tensor:
        return input_.view_as(input_)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state

        summed = grad.contiguous()
        dist.all_reduce(summed, group=parallel_state.get_tensor_model_parallel_group())
        return summed
