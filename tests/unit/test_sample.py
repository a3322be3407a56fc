import json

import pytest

from lean_rl.sample import NOT_GENERATED, Sample, Status


def _sample():
    return Sample(index=0, group_index=0, prompt="p", tokens=[5, 6, 7])


def test_append_keeps_per_token_lists_aligned_with_the_response():
    s = _sample()
    s.append_response([10, 11], "ab", log_probs=[-0.5, -1.0], weight_versions=3)
    s.append_response([12], "<tool>", trainable=False)
    s.append_response([13], "c", log_probs=[-0.1], weight_versions=[4])
    s.check()
    assert s.tokens == [5, 6, 7, 10, 11, 12, 13]
    assert s.prompt_length == 3 and s.response_length == 4 and s.response_tokens == [10, 11, 12, 13]
    assert s.loss_mask == [1, 1, 0, 1]
    assert s.rollout_log_probs == [-0.5, -1.0, 0.0, -0.1]
    assert s.weight_versions == [3, 3, NOT_GENERATED, 4]
    assert s.oldest_version == 3  # tool tokens do not count


def test_append_rejects_mismatched_lengths_and_missing_log_probs():
    s = _sample()
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        s.append_response([1, 2], log_probs=[-1.0], weight_versions=0)
    with pytest.raises(ValueError, match="need log_probs"):
        s.append_response([1])
    assert s.tokens == [5, 6, 7] and s.response_length == 0


def test_roundtrip_and_check_catch_corruption():
    s = _sample()
    s.append_response([9], "x", log_probs=[-2.0], weight_versions=1)
    s.status, s.reward = Status.TRUNCATED, 1.0
    again = Sample.from_dict(s.to_dict())
    assert again == s and again.status is Status.TRUNCATED
    bad = s.to_dict()
    bad["loss_mask"] = [1, 1]
    with pytest.raises(ValueError, match="loss_mask 2"):
        Sample.from_dict(bad)


def test_reset_response_restores_the_prompt_only():
    s = _sample()
    s.append_response([9, 8], "xy", log_probs=[-1.0, -1.0], weight_versions=0)
    s.status, s.reward = Status.ABORTED, 0.5
    s.reset_response()
    assert s.tokens == [5, 6, 7] and s.response == "" and s.status is Status.PENDING and s.reward is None
    assert s.oldest_version is None


def test_teacher_log_probs_round_trip_are_checked_and_follow_the_response():
    s = _sample()
    s.append_response([9, 8], "xy", log_probs=[-1.0, -1.0], weight_versions=0)
    s.teacher_log_probs = [-0.5, -2.25]
    again = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s and again.teacher_log_probs == [-0.5, -2.25]
    older = s.to_dict()
    del older["teacher_log_probs"]  # saved before the field existed: none
    assert Sample.from_dict(older).teacher_log_probs == []
    for bad, message in (([-0.5], "teacher_log_probs 1 \\(0 or response_length\\)"),
                         (["x", "y"], "field 'teacher_log_probs' must be a list of numbers")):
        with pytest.raises(ValueError, match=message):
            Sample.from_dict({**s.to_dict(), "teacher_log_probs": bad})
    s.append_response([7], "z", log_probs=[-1.0], weight_versions=0)  # they scored a shorter response
    assert s.teacher_log_probs == []
    s.check()
    s.teacher_log_probs = [-1.0, -1.0, -1.0]
    s.reset_response()
    assert s.teacher_log_probs == []


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_a_loss_weight_that_is_not_a_positive_number_is_refused(weight):
    sample = Sample(index=4, group_index=0, prompt="p", tokens=[1, 2])
    sample.loss_weight = weight
    with pytest.raises(ValueError, match="sample 4: loss_weight"):
        sample.check()
    data = Sample(index=4, group_index=0, prompt="p", tokens=[1, 2]).to_dict() | {"loss_weight": weight}
    with pytest.raises(ValueError, match="loss_weight"):
        Sample.from_dict(data)
