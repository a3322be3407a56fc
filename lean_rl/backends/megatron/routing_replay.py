"""Rollout routing replay (R3, arXiv 2510.11370; --use-rollout-routing-replay), rank side: before each
forward of a micro-batch (log-prob passes and training forward/backward alike), every MoE router of
this rank is handed the experts the engine chose for exactly the tokens it will see, in the order it
sees them, and uses those instead of its own top-k. The backward pass then differentiates the same
routing the forward used (autograd keeps the replayed indices; nothing is recomputed).

Layout. A micro-batch carries "routed_experts" [b, s, num_layers, topk] int32 (train_batches.py: the
engine's row for token t at position t, NO_ROUTE on tokens it has no route for: padding, the last token,
observations appended after the last model call). Megatron's router sees [s, b] flattened sequence-first
(router.py:560 `logits.view(-1, num_experts)` of [s, b, E]); under sequence parallelism each TP rank
only its contiguous s / tp chunk of positions (the embedding's scatter); a pipeline stage owns the
routers of its own layers, each knowing its global 1-based layer_number.

Rows that hold NO_ROUTE take the router's own top-k. The same forward also counts, per router, the
(token, layer) routes whose own top-k differs from the engine's: train/routing_mismatch_frac (given the
replayed earlier layers, so it measures each layer's disagreement, not drift compounded over layers).
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.transformer.moe.router_replay import RouterReplay

from lean_rl.routed_experts import NO_ROUTE

ROUTES = "routed_experts"  # the micro-batch key (train_batches.py lays it out)


class RouteReplay(RouterReplay):
    """One router's replay: the engine's top-k where it has one, the router's own elsewhere. Plugged
    into Megatron's replay hook (backends/megatron/model_hooks.py install_route_replay); with no target set
    (a forward without routes: the weight-sync probe, scoring) it is the router's own top-k."""

    def __init__(self, layer_number: int, sequence_parallel: bool):
        # Not super().__init__(): that registers every instance in a process-wide static list
        # (router_replay.py:26) meant for its static set_replay_data; each rank addresses its own.
        self.layer_number = layer_number
        self.sequence_parallel = sequence_parallel
        self.target_topk_idx: torch.Tensor | None = None
        self.counts = torch.zeros(2, dtype=torch.long)  # (routes that differ, routes replayed)

    def set_target_indices(self, topk_indices: torch.Tensor | None) -> None:
        self.target_topk_idx = topk_indices

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        own_values, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        target = self.target_topk_idx
        if target is None:
            return own_values, own
        target = target.to(scores.device, torch.long)
        if target.shape != own.shape:
            raise RuntimeError(f"layer {self.layer_number}: routes for {tuple(target.shape)} (tokens, top-k), the "
                               f"router has {tuple(own.shape)}")
        replayed = (target != NO_ROUTE).all(dim=-1, keepdim=True)
        indices = torch.where(replayed, target, own)
        with torch.no_grad():
            differ = (own.sort(dim=-1).values != target.sort(dim=-1).values).any(dim=-1) & replayed.squeeze(-1)
            self.counts = self.counts.to(scores.device) + torch.stack([differ.sum(), replayed.sum()])
        return scores.gather(1, indices), indices


def route_replays(model: torch.nn.Module) -> list[RouteReplay]:
    """This rank's replays (one per MoE layer of its stage), in layer order."""
    found = [m.router_replay for m in model.modules() if isinstance(getattr(m, "router_replay", None), RouteReplay)]
    return sorted(found, key=lambda replay: replay.layer_number)


def router_view(routes: torch.Tensor, layer_number: int, chunks: int = 1, chunk: int = 0) -> torch.Tensor:
    """[tokens, topk] of layer `layer_number` (1-based) from [b, s, layers, topk] micro-batch routes, in
    the order a router sees the tokens: sequence-first; under sequence parallelism (`chunks` = TP size)
    only the positions of its TP rank `chunk`."""
    per_layer = routes[:, :, layer_number - 1].transpose(0, 1)  # [s, b, topk]
    if chunks > 1:
        length = per_layer.shape[0] // chunks
        per_layer = per_layer[chunk * length:(chunk + 1) * length]
    return per_layer.reshape(-1, per_layer.shape[-1])


def set_micro_batch_routes(model: torch.nn.Module, micro_batch: dict[str, torch.Tensor],
                           device: torch.device) -> None:
    """Hand every router of `model` its routes of `micro_batch` (or none: the router's own top-k)."""
    replays = route_replays(model)
    if not replays:
        return
    routes = micro_batch.get(ROUTES)
    if routes is None:
        clear_routes(model)
        return
    routes = routes.to(device)
    tp_size, tp_rank = (parallel_state.get_tensor_model_parallel_world_size(),
                        parallel_state.get_tensor_model_parallel_rank())
    for replay in replays:
        chunks, chunk = (tp_size, tp_rank) if replay.sequence_parallel else (1, 0)
        replay.set_target_indices(router_view(routes, replay.layer_number, chunks, chunk))


def clear_routes(model: torch.nn.Module) -> None:
    for replay in route_replays(model):
        replay.set_target_indices(None)


def reset_mismatch(model: torch.nn.Module) -> None:
    for replay in route_replays(model):
        replay.counts = torch.zeros(2, dtype=torch.long)


def mismatch_counts(model: torch.nn.Module) -> torch.Tensor:
    """(routes that differ, routes replayed) on this rank since reset_mismatch."""
    total = torch.zeros(2, dtype=torch.long)
    for replay in route_replays(model):
        total += replay.counts.cpu()
    return total
