"""Optimizer step -> per-DP-rank micro-batches (pure)."""

import pytest
import torch

from lean_rl.backends.megatron.train_batches import (Sequence, assign_to_ranks, build_micro_batch, pad_micro_batch,
                                                     plan_micro_batches, response_values, uniform_shapes)
from lean_rl.backends.megatron.train_config import BatchConfig
from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.options import ConfigError


def test_fixed_micro_batches_round_robin_then_longest_first():
    plan = plan_micro_batches([5, 3, 8, 2], BatchPlan(BatchConfig(micro_batch_size=1), 2))
    assert plan == [[[2], [0]], [[1], [3]]]  # rank 0 holds 0 and 2, rank 1 holds 1 and 3
    plan = plan_micro_batches([5, 3, 8, 2, 4, 6, 1, 7], BatchPlan(BatchConfig(micro_batch_size=2), 2))
    # rank 0: lengths 5 8 4 1 (indices 0 2 4 6) -> longest first 2 0 | 4 6
    assert plan == [[[2, 0], [4, 6]], [[7, 5], [1, 3]]]


def test_fixed_micro_batches_must_divide_the_step():
    with pytest.raises(ConfigError, match="--micro-batch-size 2 x data-parallel size 2"):
        plan_micro_batches([1] * 6, BatchPlan(BatchConfig(micro_batch_size=2), 2))


def test_balance_data_evens_tokens_with_equal_counts():
    lengths = [10, 9, 8, 1]
    plain = assign_to_ranks(lengths, 2, balance=False, equal_counts=True)
    balanced = assign_to_ranks(lengths, 2, balance=True, equal_counts=True)
    assert plain == [[0, 2], [1, 3]]  # 18 vs 10 tokens
    # longest first, each to the lighter rank with room: 10->r0, 9->r1, 8->r1 (9 < 10), 1->r0 (r1 full)
    assert balanced == [[0, 3], [1, 2]]  # 11 vs 17 tokens
    spread = lambda shares: max(sum(lengths[i] for i in s) for s in shares) - min(sum(lengths[i] for i in s) for s in shares)
    assert spread(balanced) < spread(plain)
    # dynamic batching may give ranks different counts: 10 | 5 5
    free = assign_to_ranks([10, 5, 5], 2, balance=True, equal_counts=False)
    assert free == [[0], [1, 2]]


def test_dynamic_batches_respect_the_token_budget():
    batch = BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=12)
    # longest first: [6, 5] costs 2 x 6 = 12; 4 opens a bin, 3 and 2 fit (3 x 4 = 12); 1 would make 4 x 4
    assert plan_micro_batches([6, 5, 4, 3, 2, 1], BatchPlan(batch, 1)) == [[[0, 1], [2, 3, 4], [5]]]
    # a length multiple (sequence parallel) pads rows: 5 -> 6, so [5, 5] costs 12, a third row 18
    assert plan_micro_batches([5, 5, 5], BatchPlan(batch, 1), length_multiple=3) == [[[0, 1], [2]]]


def test_dynamic_batches_give_every_rank_the_same_count():
    batch = BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=8)
    plan = plan_micro_batches([8, 8, 8, 2, 2, 2], BatchPlan(batch, 2))
    # rank 0 holds 8, 8, 2 (three bins: [8], [8], [2]); rank 1 holds 8, 2, 2 ([8], [2, 2]) -> split to 3
    assert [len(p) for p in plan] == [3, 3]
    assert sorted(i for mbs in plan[1] for i in [*mbs]) == [1, 3, 5]
    plan = plan_micro_batches([8, 8, 8, 1], BatchPlan(batch, 2))  # rank 0: [8], [8]; rank 1: [8], [1]
    assert [len(p) for p in plan] == [2, 2]
    plan = plan_micro_batches([8, 8, 8], BatchPlan(batch, 2))  # rank 1 has one sequence: an empty micro-batch pads it
    assert plan[1] == [[1], []]


def test_dynamic_batch_rejects_a_sequence_over_budget():
    with pytest.raises(ConfigError, match="--max-tokens-per-gpu 8"):
        plan_micro_batches([9], BatchPlan(BatchConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=8), 1))


SEQS = [Sequence(tokens=(11, 12, 13, 14, 15), prompt_length=2), Sequence(tokens=(21, 22, 23), prompt_length=1)]
FIELDS = {"adv": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])}  # [B, T], response-aligned


def test_micro_batch_layout_puts_each_response_value_where_its_token_is_predicted():
    mb = build_micro_batch([0, 1], SEQS, FIELDS, length_multiple=2)
    assert mb["tokens"].tolist() == [[11, 12, 13, 14, 15, 0], [21, 22, 23, 0, 0, 0]]
    # position t predicts token t + 1: response token j of prompt length P sits at P - 1 + j
    assert mb["adv"].tolist() == [[0, 1, 2, 3, 0, 0], [4, 5, 0, 0, 0, 0]]
    back = response_values(mb, mb["adv"], SEQS)
    assert back[0].tolist() == [1, 2, 3] and back[1].tolist() == [4, 5]
    empty = build_micro_batch([], SEQS, FIELDS, length_multiple=2)
    assert empty["tokens"].shape == (1, 2) and empty["sequence_index"].tolist() == [-1]
    with pytest.raises(ValueError, match="2 values per row for the 3 response tokens of sequence 0"):
        build_micro_batch([0], SEQS, {"adv": torch.ones(2, 2)})


def test_fields_with_k_values_per_token_keep_their_integer_type_in_the_layout():
    ids = torch.tensor([[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [0, 0]]])  # [B, T, K] token ids
    mb = build_micro_batch([0, 1], SEQS, {"top_ids": ids, **FIELDS})
    assert mb["top_ids"].dtype == torch.long and mb["top_ids"].shape == (2, 5, 2)
    assert mb["top_ids"][0].tolist() == [[0, 0], [1, 2], [3, 4], [5, 6], [0, 0]]
    assert mb["top_ids"][1, :2].tolist() == [[7, 8], [9, 10]] and mb["adv"].dtype == torch.float32
    empty = build_micro_batch([], SEQS, {"top_ids": ids})
    assert empty["top_ids"].shape == (1, 1, 2) and empty["top_ids"].dtype == torch.long


def test_uniform_shapes_pads_the_kth_micro_batch_of_every_rank():
    a, b = build_micro_batch([0], SEQS, FIELDS), build_micro_batch([1], SEQS, FIELDS)
    out = uniform_shapes([[a], [pad_micro_batch(b, 2, 3)]])
    assert out[0][0]["tokens"].shape == out[1][0]["tokens"].shape == (2, 5)
    assert out[0][0]["sequence_index"].tolist() == [0, -1]
    assert out[0][0]["adv"][1].abs().sum() == 0
