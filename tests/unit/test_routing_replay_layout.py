"""Rollout routing replay, the pure parts: how routes travel from an SGLang response into a Sample
(partial rollouts, multi-turn), how they are laid out in micro-batches, the order a router sees them
in, and the replay itself (Megatron's top-k routing with the engine's experts, NO_ROUTE fallback)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lean_rl import routed_experts as routes
from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.rollout_batch import rollout_batch
from lean_rl.backends.megatron.train_batches import ROUTES, build_micro_batch, uniform_shapes
from lean_rl.backends.sglang.responses import build_generate_payload, parse_generate_response
from lean_rl.backends.sglang.server_command import server_flags
from lean_rl.options import ConfigError
from lean_rl.sample import Sample, Status

LAYERS, TOPK, EXPERTS = 2, 2, 4
NO = routes.NO_ROUTE


def engine_routes(rows: int, seed: int) -> np.ndarray:
    """[rows, layers, topk] distinct experts per row, as an engine routes."""
    rng = np.random.default_rng(seed)
    return np.stack([[rng.choice(EXPERTS, TOPK, replace=False) for _ in range(LAYERS)] for _ in range(rows)]
                    ).astype(np.int32)


def sglang_body(input_len: int, output_ids: list[int], routed: np.ndarray | None, finish: str = "length") -> dict:
    """A /generate body as SGLang 0.5.23 answers it with return_logprob and return_routed_experts."""
    n = len(output_ids)
    return {"text": "", "output_ids": output_ids, "meta_info": {
        "id": "r1", "finish_reason": {"type": finish, **({"length": n} if finish == "length" else {})},
        "prompt_tokens": input_len, "completion_tokens": n, "cached_tokens": 0, "weight_version": "3",
        "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
        "weight_versions": [{"version": "3", "start": 0, "end": n}],
        "routed_experts": None if routed is None else routes.encode(routed)}}


def engine_call(sample: Sample, output_ids: list[int], seed: int):
    """What rollout/default.generate does with one /generate of sample.tokens."""
    rows = len(sample.tokens) + len(output_ids) - 1
    given = engine_routes(rows, seed)
    result = parse_generate_response(sglang_body(len(sample.tokens), output_ids, given), return_logprob=True,
                                     return_routed_experts=True)
    sample.append_response(result.output_ids, log_probs=result.output_log_probs, weight_versions=3,
                           routed_experts=result.routed_experts)
    return given


def held(sample: Sample) -> np.ndarray:
    return routes.decode(sample.routed_experts, len(sample.tokens) - 1).reshape(-1, LAYERS, TOPK)


def micro_batch_routes(samples: list[Sample], **kwargs) -> torch.Tensor:
    batch = rollout_batch([samples])
    mb = build_micro_batch(list(range(len(samples))), batch.sequences, {}, route_shape=(LAYERS, TOPK), **kwargs)
    return mb[ROUTES]


def test_routes_encode_decode_and_extend():
    given = engine_routes(5, seed=0)
    encoded = routes.encode(given)
    assert routes.num_values(encoded) == 5 * LAYERS * TOPK and routes.width(encoded, 5) == LAYERS * TOPK
    assert np.array_equal(routes.decode(encoded, 5), given.reshape(5, -1))
    longer = routes.decode(routes.extend(encoded, 5, 2), 7)
    assert np.array_equal(longer[:5], given.reshape(5, -1)) and (longer[5:] == NO).all()
    with pytest.raises(ValueError, match="do not make 3 rows"):
        routes.width(encoded, 3)
    with pytest.raises(ValueError, match="not base64"):
        routes.decode("@@@@", 1)


def test_partial_rollout_the_continuing_call_replaces_the_routes():
    """An aborted sample continues from its tokens: the new call's input is all of them, so its routes
    (one per token but the last, prefix included) replace the old ones."""
    sample = Sample(index=0, group_index=0, prompt="p", tokens=[5, 6, 7, 8, 9])
    first = engine_call(sample, [10, 11, 12, 13], seed=1)
    assert np.array_equal(held(sample), first) and held(sample).shape == (8, LAYERS, TOPK)
    sample.status = Status.ABORTED
    second = engine_call(sample, [14, 15, 16], seed=2)  # e.g. after a weight update: new routes for the prefix too
    assert held(sample).shape == (11, LAYERS, TOPK) and np.array_equal(held(sample), second)
    sample.status, sample.reward = Status.TRUNCATED, 1.0
    sample.check()
    again = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))  # the buffer's checkpoint / jsonl dump
    assert again.routed_experts == sample.routed_experts
    laid_out = micro_batch_routes([sample])  # [1, 12, layers, topk]: token t's route at position t
    assert torch.equal(laid_out[0, :11], torch.from_numpy(second)) and (laid_out[0, 11] == NO).all()
    sample.reset_response()  # partial tokens dropped: their routes too
    assert sample.routed_experts is None


def test_multi_turn_observations_have_no_route_until_a_later_call_takes_them_as_input():
    sample = Sample(index=0, group_index=0, prompt="p", tokens=[5, 6, 7, 8])
    turn1 = engine_call(sample, [20, 21, 22], seed=3)  # 7 tokens, rows 0..5
    sample.append_response([30, 31], trainable=False)  # observation: tokens 7, 8
    assert held(sample).shape == (8, LAYERS, TOPK)
    assert np.array_equal(held(sample)[:6], turn1) and (held(sample)[6:] == NO).all()  # tokens 6 (last output), 7
    turn2 = engine_call(sample, [23, 24], seed=4)  # input: the 9 tokens so far
    assert np.array_equal(held(sample), turn2) and held(sample).shape == (10, LAYERS, TOPK)
    sample.append_response([32, 33, 34], trainable=False)  # a last observation, no model call after it
    sample.status, sample.reward = Status.TRUNCATED, 0.0
    sample.check()
    laid_out = micro_batch_routes([sample])[0]
    assert torch.equal(laid_out[:10], torch.from_numpy(turn2)) and (laid_out[10:] == NO).all()
    assert sample.loss_mask == [1, 1, 1, 0, 0, 1, 1, 0, 0, 0]


def test_sample_check_and_from_dict_refuse_routes_of_the_wrong_length():
    sample = Sample(index=7, group_index=0, prompt="p", tokens=[1, 2, 3])
    sample.routed_experts = routes.encode(engine_routes(3, seed=0))[:-4]  # not a whole number of values
    with pytest.raises(ValueError, match="sample 7: routed_experts"):
        sample.check()
    sample.routed_experts = routes.encode(np.zeros(5, dtype=np.int32))  # 5 values for 2 rows
    with pytest.raises(ValueError, match="sample 7: routed_experts: 5 values do not make 2 rows"):
        sample.check()
    with pytest.raises(ValueError, match="routed_experts' must be base64 text or null"):
        Sample.from_dict({"index": 0, "group_index": 0, "prompt": "p", "tokens": [1, 2], "routed_experts": [1]})


def test_generate_payload_and_response_checks():
    assert build_generate_payload([1, 2], {}, return_routed_experts=True)["return_routed_experts"] is True
    assert "return_routed_experts" not in build_generate_payload([1, 2], {})
    with pytest.raises(ValueError, match="no routed_experts .*--enable-return-routed-experts"):
        parse_generate_response(sglang_body(3, [4, 5], None), return_logprob=True, return_routed_experts=True)
    with pytest.raises(ValueError, match="do not make 5 rows"):  # routes of another length than input + output - 1
        parse_generate_response(sglang_body(4, [4, 5], engine_routes(3, 0)), return_logprob=True,
                                return_routed_experts=True)
    aborted = parse_generate_response(sglang_body(3, [], None, finish="abort"), return_logprob=True,
                                      return_routed_experts=True)
    assert aborted.aborted and aborted.routed_experts is None
    cut_short = parse_generate_response(sglang_body(4, [4, 5], engine_routes(3, 0), finish="abort"),
                                        return_logprob=True, return_routed_experts=True)
    assert cut_short.output_ids == [4, 5] and cut_short.routed_experts is None  # kept tokens, no routes
    ignored = parse_generate_response(sglang_body(3, [4], engine_routes(3, 0)), return_logprob=True)
    assert ignored.routed_experts is None  # not asked for: not kept


def test_micro_batch_layout_pads_with_no_route_and_keeps_rows_apart():
    """Rows of different lengths in one micro-batch: each row's route of token t at [row, t]; padding,
    last tokens, samples without routes and padding micro-batches are NO_ROUTE."""
    a = Sample(index=0, group_index=0, prompt="p", tokens=[5, 6, 7])
    routes_a = engine_call(a, [8, 9], seed=5)  # 5 tokens
    b = Sample(index=1, group_index=0, prompt="p", tokens=[5, 6])
    routes_b = engine_call(b, [7], seed=6)  # 3 tokens
    c = Sample(index=2, group_index=0, prompt="p", tokens=[5, 6])
    c.append_response([7, 8], log_probs=[-1.0, -1.0], weight_versions=3)  # no routes: the trainer routes it
    for s in (a, b, c):
        s.status, s.reward = Status.COMPLETED, 1.0
    laid_out = micro_batch_routes([a, b, c], length_multiple=4)
    assert laid_out.shape == (3, 8, LAYERS, TOPK) and laid_out.dtype == torch.int32
    assert torch.equal(laid_out[0, :4], torch.from_numpy(routes_a)) and (laid_out[0, 4:] == NO).all()
    assert torch.equal(laid_out[1, :2], torch.from_numpy(routes_b)) and (laid_out[1, 2:] == NO).all()
    assert (laid_out[2] == NO).all()
    batch = rollout_batch([[a, b, c]])
    empty = build_micro_batch([], batch.sequences, {}, route_shape=(LAYERS, TOPK))
    assert empty[ROUTES].shape == (1, 1, LAYERS, TOPK) and (empty[ROUTES] == NO).all()
    full = build_micro_batch([0], batch.sequences, {}, route_shape=(LAYERS, TOPK))
    (grown, padded), = zip(*uniform_shapes([[full], [empty]]))  # the allgather dispatcher's equal shapes
    assert grown[ROUTES].shape == padded[ROUTES].shape == (1, 5, LAYERS, TOPK)
    assert (padded[ROUTES] == NO).all() and torch.equal(grown[ROUTES], full[ROUTES])
    with pytest.raises(ValueError, match=r"expected \[4, 3 layers x top-2\]"):
        build_micro_batch([0], batch.sequences, {}, route_shape=(3, TOPK))


def test_router_view_is_sequence_first_and_splits_positions_under_sequence_parallelism():
    from lean_rl.backends.megatron.routing_replay import router_view

    b, s = 2, 4  # value = 1000 * layer + 10 * position + row: says where it came from
    grid = torch.tensor([[[[1000 * layer + 10 * t + r] * TOPK for layer in range(LAYERS)] for t in range(s)]
                         for r in range(b)])
    assert grid.shape == (b, s, LAYERS, TOPK)
    order = [1000 + 10 * t + r for t in range(s) for r in range(b)]  # layer 2: [s, b] flattened
    assert router_view(grid, layer_number=2)[:, 0].tolist() == order
    assert router_view(grid, 2, chunks=2, chunk=1)[:, 0].tolist() == order[4:]  # TP rank 1: positions 2, 3
    assert router_view(grid, 1, chunks=2, chunk=0)[:, 0].tolist() == [10 * t + r for t in range(2) for r in range(b)]


def test_replay_uses_the_engine_experts_falls_back_on_no_route_and_counts_disagreement():
    """Megatron's own top-k routing (moe_utils.topk_routing_with_score_function) with our replay:
    softmax over the replayed experts' logits (Qwen3-MoE: top-k, then normalised)."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    from lean_rl.backends.megatron.routing_replay import RouteReplay

    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 0.0]], requires_grad=True)
    own_probs, own_map = topk_routing_with_score_function(logits, TOPK)
    replay = RouteReplay(layer_number=1, sequence_parallel=False)
    probs, routing_map = topk_routing_with_score_function(logits, TOPK, router_replay=replay)  # no target: own
    assert torch.equal(probs, own_probs) and torch.equal(routing_map, own_map) and replay.counts.tolist() == [0, 0]
    replay.set_target_indices(torch.tensor([[3, 2], [NO, NO], [2, 1]]))
    probs, routing_map = topk_routing_with_score_function(logits, TOPK, router_replay=replay)
    expected_map = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(routing_map, expected_map)
    e = torch.e
    expected = torch.tensor([[0, 0, e / (e + 1), 1 / (e + 1)],  # replayed: softmax of logits 1, 0
                             [0, 0, 1 / (e + 1), e / (e + 1)],  # NO_ROUTE: its own top-2 (experts 3, 2)
                             [0, e / (e + 1), 1 / (e + 1), 0]])  # replayed, the same as its own
    assert torch.allclose(probs, expected)
    assert replay.counts.tolist() == [1, 2]  # of 2 replayed tokens, 1 would have gone elsewhere
    (probs * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert (logits.grad[0, :2] == 0).all() and (logits.grad[0, 2:] != 0).all()  # through the replayed experts
    with pytest.raises(RuntimeError, match="routes for \\(2, 2\\)"):
        replay.set_target_indices(torch.tensor([[0, 1], [2, 3]]))
        topk_routing_with_score_function(logits, TOPK, router_replay=replay)


def test_flag_needs_an_moe_model_and_turns_on_the_engines(tiny_qwen2, tiny_model_factory, tmp_path):
    from lean_rl.backends.megatron.hf_config import arch_from_hf_config
    from lean_rl.config import parse_config

    with pytest.raises(ConfigError, match="--use-rollout-routing-replay needs an MoE model"):
        MegatronConfig(arch_from_hf_config(tiny_qwen2), ParallelConfig(), use_rollout_routing_replay=True)
    moe = arch_from_hf_config(tiny_model_factory("qwen3_moe"))
    assert MegatronConfig(moe, ParallelConfig(), use_rollout_routing_replay=True).use_rollout_routing_replay
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    with pytest.raises(ConfigError, match="--use-rollout-routing-replay needs an MoE model"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--use-rollout-routing-replay"])
    base = ["--hf-checkpoint", str(tiny_model_factory("qwen3_moe")), "--prompt-data", str(data)]
    cfg = parse_config(base + ["--use-rollout-routing-replay"])
    assert cfg.megatron.use_rollout_routing_replay and cfg.engines.return_routed_experts
    assert "--enable-return-routed-experts" in server_flags(cfg.engines, 0, 30000)
    plain = parse_config(base)
    assert not plain.engines.return_routed_experts
    assert "--enable-return-routed-experts" not in server_flags(plain.engines, 0, 30000)
