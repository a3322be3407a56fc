"""Scoring a fixed token sequence with /generate (the weight-sync probe's engine side): payload and
parsing, pure."""

import pytest

from lean_rl.backends.sglang.responses import build_score_payload, parse_score_response


def test_score_payload_asks_for_every_input_log_prob():
    payload = build_score_payload([5, 6, 7])
    assert payload["input_ids"] == [5, 6, 7]
    assert payload["return_logprob"] is True and payload["logprob_start_len"] == 0
    assert payload["sampling_params"] == {"max_new_tokens": 1, "temperature": 0.0}
    with pytest.raises(ValueError, match="at least 2 tokens"):
        build_score_payload([5])


def body(entries, version="3"):
    return {"text": "x", "output_ids": [1], "meta_info": {"input_token_logprobs": entries, "weight_version": version}}


def test_parse_score_skips_the_first_token_and_tolerates_the_last_id_quirk():
    # 0.5.23 reports id vocab_size-1 (here 511) as 0
    result = parse_score_response(body([[None, 5, None], [-1.5, 6, None], [-0.25, 0, None]]), [5, 6, 511])
    assert result.log_probs == [-1.5, -0.25] and result.weight_version == "3"


@pytest.mark.parametrize("entries, match", [
    ([[None, 5, None], [-1.0, 6, None]], "expected 3 input_token_logprobs"),
    ([[None, 5, None], [-1.0, 9, None], [-1.0, 7, None]], r"input_token_logprobs\[1\] is for token 9"),
    ([[None, 5, None], [None, 6, None], [-1.0, 7, None]], "null log-prob"),
])
def test_parse_score_rejects_misaligned_answers(entries, match):
    with pytest.raises(ValueError, match=match):
        parse_score_response(body(entries), [5, 6, 7])


def test_score_with_top_k_asks_for_and_parses_the_top_logprobs_of_every_position():
    payload = build_score_payload([5, 6, 7], top_k=2)
    assert payload["top_logprobs_num"] == 2 and "top_logprobs_num" not in build_score_payload([5, 6, 7])
    answer = body([[None, 5, None], [-1.5, 6, None], [-0.25, 7, None]])
    answer["meta_info"]["input_top_logprobs"] = [None, [[-0.1, 6, "a"], [-2.5, 9, "b"]],
                                                 [[-0.25, 7, "c"], [-1.75, 3, "d"]]]
    result = parse_score_response(answer, [5, 6, 7], top_k=2)
    assert result.top_ids == [[6, 9], [7, 3]] and result.top_log_probs == [[-0.1, -2.5], [-0.25, -1.75]]
    answer["meta_info"]["input_top_logprobs"][2] = [[-0.25, 7, "c"]]
    with pytest.raises(ValueError, match=r"input_top_logprobs\[2\]: expected 2"):
        parse_score_response(answer, [5, 6, 7], top_k=2)
    del answer["meta_info"]["input_top_logprobs"]
    with pytest.raises(ValueError, match="expected 3 input_top_logprobs"):
        parse_score_response(answer, [5, 6, 7], top_k=2)
