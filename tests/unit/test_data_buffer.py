import random

import pytest

from lean_rl.buffer.data_buffer import DataBuffer
from lean_rl.buffer.prompt_source import PromptRecord, PromptSource
from lean_rl.sample import Status


def _buffer(n_prompts=10, n_samples=2, max_staleness=None, num_epochs=1, shuffle=True):
    records = [PromptRecord(row=i + 1, prompt=f"p{i}", tokens=(1, 2, i)) for i in range(n_prompts)]
    return DataBuffer(PromptSource(records, shuffle=shuffle, seed=3, num_epochs=num_epochs), n_samples, max_staleness)


def _generate(group, version, n_tokens=2):
    for s in group:
        s.append_response([7] * n_tokens, "r", log_probs=[-1.0] * n_tokens, weight_versions=version)
        s.status, s.reward = Status.COMPLETED, 1.0
    return group


def test_groups_have_n_samples_sharing_a_group_index_and_unique_sample_indices():
    buf = _buffer(n_prompts=3, n_samples=4)
    groups = buf.get_prompt_groups(5)
    assert len(groups) == 3  # data used up after one epoch
    assert all(len(g) == 4 and len({s.group_index for s in g}) == 1 for g in groups)
    assert len({s.index for g in groups for s in g}) == 12
    assert buf.num_in_flight() == 3


def test_returning_a_group_twice_or_one_never_handed_out_is_an_error():
    buf = _buffer()
    (group,) = buf.get_prompt_groups(1)
    buf.put_finished_groups([_generate(group, 0)])
    with pytest.raises(ValueError, match="came back twice"):
        buf.put_finished_groups([group])


def _drive(buf, rng, version, trained_rows, steps):
    """Random interleaving of generate / partial / drop / train, recording what training consumed."""
    for _ in range(steps):
        groups = buf.get_prompt_groups(rng.randint(1, 3))
        if not groups:
            return
        for g in groups:
            action = rng.random()
            if action < 0.2:
                buf.put_partial_groups([g])
            elif action < 0.3:
                buf.drop_groups([g], "filtered")
                trained_rows.append(("dropped", g[0].metadata["epoch"], g[0].metadata["prompt_row"]))
            else:
                buf.put_finished_groups([_generate(g, version)])
        for g in buf.get_train_groups(rng.randint(0, 2), version):
            trained_rows.append(("trained", g[0].metadata["epoch"], g[0].metadata["prompt_row"]))


def test_exactly_once_through_save_and_restore_with_groups_in_flight():
    rng = random.Random(0)
    buf = _buffer(n_prompts=40, n_samples=2, num_epochs=1)
    consumed = []
    _drive(buf, rng, 0, consumed, steps=6)
    in_flight = buf.get_prompt_groups(3)  # handed out, never returned: lost with the "crash"
    assert in_flight and buf.num_in_flight() == 3
    state = buf.state_dict()

    restored = _buffer(n_prompts=40, n_samples=2, num_epochs=1)
    restored.load_state_dict(state)
    _drive(restored, rng, 0, consumed, steps=200)
    while restored.num_pending() or restored.num_ready():  # flush what is left
        for g in restored.get_prompt_groups(10):
            restored.put_finished_groups([_generate(g, 0)])
        for g in restored.get_train_groups(100, 0):
            consumed.append(("trained", g[0].metadata["epoch"], g[0].metadata["prompt_row"]))
    rows = [(epoch, row) for _, epoch, row in consumed]
    assert sorted(rows) == [(0, r) for r in range(1, 41)]  # every prompt once: none lost, none repeated


def test_partial_groups_keep_tokens_and_come_back_first():
    buf = _buffer(n_prompts=5, n_samples=1)
    (g,) = buf.get_prompt_groups(1)
    g[0].append_response([9, 9], "", log_probs=[-1.0, -1.0], weight_versions=4)
    g[0].status = Status.ABORTED
    buf.put_partial_groups([g])
    (again,) = buf.get_prompt_groups(1)
    assert again[0].group_index == g[0].group_index
    assert again[0].response_tokens == [9, 9] and again[0].weight_versions == [4, 4]


def test_staleness_requeues_old_groups_and_returns_fresh_ones():
    buf = _buffer(n_prompts=4, n_samples=2, max_staleness=1)
    old, fresh = buf.get_prompt_groups(2)
    _generate(old, 2)
    old[1].append_response([1], "", log_probs=[-1.0], weight_versions=0)  # one token from version 0
    buf.put_finished_groups([old, _generate(fresh, 2)])
    got = buf.get_train_groups(2, policy_version=2)
    assert [g[0].group_index for g in got] == [fresh[0].group_index]
    assert buf.get_counters()["groups_requeued_stale"] == 1
    (requeued,) = buf.get_prompt_groups(1)
    assert requeued[0].group_index == old[0].group_index and requeued[0].response_length == 0
    assert all(s.status is Status.PENDING for s in requeued)


def test_no_staleness_bound_keeps_everything():
    buf = _buffer(n_prompts=2, n_samples=1, max_staleness=None)
    (g,) = buf.get_prompt_groups(1)
    buf.put_finished_groups([_generate(g, 0)])
    assert len(buf.get_train_groups(1, policy_version=100)) == 1


def test_max_new_limits_only_new_prompts_not_pending_ones():
    buf = _buffer(n_prompts=10, n_samples=1)
    first = buf.get_prompt_groups(3)
    buf.put_partial_groups(first[:2])
    got = buf.get_prompt_groups(5, max_new=1)
    assert [g[0].group_index for g in got[:2]] == [g[0].group_index for g in first[:2]]  # pending first
    assert len(got) == 3 and buf.get_counters()["prompts_issued"] == 4
    assert buf.get_prompt_groups(5, max_new=0) == []
