import pytest

from lean_rl.backends.megatron.scoring_plan import PAD_TOKEN_ID, micro_batch_rows, plan_scoring


def test_sequences_go_round_robin_and_every_rank_runs_the_same_shape():
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    plan = plan_scoring(seqs, [1, 1, 3, 2, 1], data_parallel_size=2, micro_batch_size=2, vocab_size=100,
                        max_seq_length=16, length_multiple=4)
    assert plan.owners == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2))
    rank0, rank1 = plan.batches
    assert rank0.token_ids == ((1, 2, 3), (6, 7, 8, 9, 10), (13, 14, 15)) and rank0.score_from == (1, 3, 1)
    assert rank1.token_ids == ((4, 5), (11, 12)) and rank1.score_from == (1, 2)
    # 3 sequences at micro-batch 2 -> 2 micro-batches on every rank; 5 tokens padded up to a multiple of 4
    assert {(b.num_micro_batches, b.micro_batch_size, b.seq_length) for b in plan.batches} == {(2, 2, 8)}
    assert micro_batch_rows(rank0, 1) == [(13, 14, 15) + (PAD_TOKEN_ID,) * 5, (PAD_TOKEN_ID,) * 8]
    assert micro_batch_rows(rank1, 1) == [(PAD_TOKEN_ID,) * 8, (PAD_TOKEN_ID,) * 8]


def test_default_scores_every_token_but_the_first():
    plan = plan_scoring([[3, 4, 5]], None, data_parallel_size=1, micro_batch_size=4, vocab_size=10, max_seq_length=8)
    assert plan.batches[0].score_from == (1,) and plan.batches[0].seq_length == 3


@pytest.mark.parametrize("seqs, score_from, message", [
    ([], None, "token_ids is empty"),
    ([[1, 2]], [0], r"score_from=0 must be in \[1, 2\]"),
    ([[1, 2]], [3], r"score_from=3 must be in \[1, 2\]"),
    ([[1, 2]], [1, 1], "score_from has 2 entries for 1 sequences"),
    ([[1] * 9], None, "9 tokens, more than --seq-length 8"),
    ([[1, 10, -1]], None, r"token ids \[10, -1\] outside \[0, --vocab-size 10\)"),
])
def test_invalid_requests_are_refused(seqs, score_from, message):
    with pytest.raises(ValueError, match=message):
        plan_scoring(seqs, score_from, data_parallel_size=1, micro_batch_size=2, vocab_size=10, max_seq_length=8)
