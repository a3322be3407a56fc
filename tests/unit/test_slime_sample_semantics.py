"""slime's Sample as slime's own code mutates it (issue 38): `append_response_tokens` extends `tokens`,
`loss_mask` and `rollout_log_probs` in place, so agent code that keeps a reference to one of those
lists across turns (and writes it back at the end) sees every token; the answer's meta_info feeds the
weight versions, the status and slime's SpecInfo / PrefixCacheInfo counters. The functions below are
our own, written in the shape of slime's multi-turn generate functions (624b824). Pure logic."""

import json
import types

import pytest

from lean_rl.utils.slime_finder import install_slime_finder

install_slime_finder()
from slime.utils.types import Sample  # noqa: E402  served by lean_rl

ARGS = types.SimpleNamespace(reward_key=None, sglang_speculative_algorithm=None)


def answer(version: str, finish: str = "stop", **counters) -> dict:
    return {"weight_version": version, "finish_reason": {"type": finish}, **counters}


def two_turn_agent(sample: Sample) -> Sample:
    """A tool-using turn loop that holds on to the sample's lists and assigns them back at the end."""
    tokens, loss_mask, log_probs = sample.tokens, sample.loss_mask, sample.rollout_log_probs
    sample.append_response_tokens(ARGS, tokens=[11, 12], log_probs=[-0.1, -0.2], meta_info=answer("3"), text="ab")
    sample.append_response_tokens(ARGS, tokens=[90, 91, 92], trainable=False, text="<tool>")
    sample.append_response_tokens(ARGS, tokens=[13], log_probs=[-0.3], meta_info=answer("4", "length"), text="c")
    sample.tokens, sample.loss_mask, sample.rollout_log_probs = tokens, loss_mask, log_probs
    return sample


def test_lists_kept_across_turns_see_every_appended_token():
    sample = Sample(tokens=[1, 2, 3], loss_mask=[], rollout_log_probs=[])
    out = two_turn_agent(sample)
    assert out.tokens == [1, 2, 3, 11, 12, 90, 91, 92, 13] and out.response_length == 6
    assert out.loss_mask == [1, 1, 0, 0, 0, 1]  # never the empty list the agent kept a reference to
    assert out.rollout_log_probs == pytest.approx([-0.1, -0.2, 0.0, 0.0, 0.0, -0.3])
    assert out.response == "ab<tool>c" and out.effective_response_length == 3
    assert out.weight_versions == ["3", "4"] and out.status is Sample.Status.TRUNCATED


def test_a_reference_taken_after_the_first_turn_is_the_list_the_sample_keeps():
    sample = Sample(tokens=[1])  # loss_mask None, as slime's data source hands a prompt out
    sample.append_response_tokens(ARGS, tokens=[5], log_probs=[-1.0])
    mask, tokens = sample.loss_mask, sample.tokens  # slime made the mask on the first append
    sample.append_response_tokens(ARGS, tokens=[6, 7], trainable=False)
    assert mask is sample.loss_mask and mask == [1, 0, 0]
    assert tokens is sample.tokens and tokens == [1, 5, 6, 7]


def test_a_mask_made_late_covers_the_response_so_far():
    sample = Sample(tokens=[1, 2], response_length=1)  # one response token from before, no mask, no log-probs
    sample.append_response_tokens(ARGS, tokens=[3], trainable=False)
    assert sample.loss_mask == [1, 0] and sample.rollout_log_probs == [0.0, 0.0]
    with pytest.raises(ValueError, match="existing response tokens but no existing rollout_log_probs"):
        Sample(tokens=[1, 2], response_length=1).append_response_tokens(ARGS, tokens=[3], log_probs=[-1.0])


def test_lists_the_agent_replaced_out_of_step_are_refused():
    sample = Sample(tokens=[1], loss_mask=[], rollout_log_probs=[-0.5])  # a log-prob with no response token
    with pytest.raises(ValueError, match="rollout_log_probs length 2 != response_length 1"):
        sample.append_response_tokens(ARGS, tokens=[2], log_probs=[-0.1])


def test_meta_info_counters_and_terminal_info():
    sample = Sample(tokens=[1])
    spec = types.SimpleNamespace(reward_key=None, sglang_speculative_algorithm="EAGLE")
    for _ in range(2):
        sample.append_response_tokens(spec, tokens=[2], log_probs=[-0.1], meta_info=answer(
            "7", cached_tokens=3, prompt_tokens=4, spec_accept_token_num=2, spec_draft_token_num=4, spec_verify_ct=1,
            completion_tokens=3))
    assert (sample.prefix_cache_info.cached_tokens, sample.prefix_cache_info.total_prompt_tokens) == (6, 8)
    assert sample.prefix_cache_info.prefix_cache_hit_rate == 0.75
    assert sample.spec_info.spec_accept_rate == 0.5 and sample.spec_info.spec_accept_length == 3.0
    plain = Sample(tokens=[1])
    plain.append_response_tokens(ARGS, tokens=[2], log_probs=[-0.1], meta_info=answer("7", spec_draft_token_num=4))
    assert plain.spec_info.spec_draft_token_num == 0  # counted only under speculative decoding, as slime does
    # an answer cut short mid-turn (update_terminal_info=False) leaves status and versions alone
    plain.append_response_tokens(ARGS, tokens=[3], log_probs=[-0.1], meta_info=answer("8", "abort"),
                                 update_terminal_info=False)
    assert plain.status is Sample.Status.COMPLETED and plain.weight_versions == ["7"]


def test_to_dict_and_back_keeps_counters_and_attributes():
    sample = Sample(tokens=[1], session_id="s")
    sample.append_response_tokens(ARGS, tokens=[2], log_probs=[-0.1], meta_info=answer("1", cached_tokens=1,
                                                                                       prompt_tokens=2))
    sample.turns = 2
    saved = json.loads(json.dumps(sample.to_dict()))
    assert saved["prefix_cache_info"] == {"cached_tokens": 1, "total_prompt_tokens": 2}
    back = Sample.from_dict(saved)
    assert back.prefix_cache_info == sample.prefix_cache_info and back.spec_info == Sample.SpecInfo()
    assert back.turns == 2 and back.status is Sample.Status.COMPLETED and back.loss_mask == [1]
