import httpx
import numpy as np
import pytest

from lean_rl.backends.sglang.responses import (
    WeightVersionSpan,
    build_generate_payload,
    build_score_payload,
    check_success,
    error_message,
    parse_generate_response,
)


def generate_body(output_ids, logprob_entries=None, finish=None, **meta):
    meta_info = {
        "id": "rid-1",
        "finish_reason": finish or {"type": "length", "length": len(output_ids)},
        "prompt_tokens": 3,
        "completion_tokens": len(output_ids),
        "cached_tokens": 1,
        "weight_version": "v7",
        **meta,
    }
    if logprob_entries is not None:
        meta_info["output_token_logprobs"] = logprob_entries
    return {"text": "abc", "output_ids": output_ids, "meta_info": meta_info}


def test_token_ids_come_from_output_ids_not_from_the_logprob_entries():
    # SGLang 0.5.23 reports the id of token vocab_size-1 (here 511) as 0 in output_token_logprobs.
    body = generate_body([7, 511, 9], [[-0.5, 7, None], [-1.25, 0, None], [-2.0, 9, None]])
    result = parse_generate_response(body, return_logprob=True)
    assert result.output_ids == [7, 511, 9]
    assert result.output_log_probs == [-0.5, -1.25, -2.0]
    assert (result.finish_reason, result.finish_detail) == ("length", 3)
    assert (result.weight_version, result.rid, result.text) == ("v7", "rid-1", "abc")
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (3, 3, 1)
    assert not result.aborted


def test_abort_and_stop_finish_reasons_and_weight_version_spans():
    aborted = parse_generate_response(
        generate_body([1, 2], finish={"type": "abort", "message": "Aborted"},
                      weight_versions=[{"version": "a", "start": 0, "end": 1}, ["b", 1, 2]]),
        return_logprob=False,
    )
    assert aborted.aborted and aborted.finish_detail == "Aborted" and aborted.output_log_probs is None
    assert aborted.weight_version_spans == (WeightVersionSpan("a", 0, 1), WeightVersionSpan("b", 1, 2))
    stopped = parse_generate_response(generate_body([1, 2], finish={"type": "stop", "matched": 2}), return_logprob=False)
    assert (stopped.finish_reason, stopped.finish_detail) == ("stop", 2)


@pytest.mark.parametrize(
    "body, match",
    [
        ([generate_body([1])], "one JSON object"),
        ({"meta_info": {}}, "missing field"),
        (generate_body([1], finish={"type": "weird"}), "unknown finish_reason"),
        (generate_body([1, 2], [[-0.1, 1, None]]), "1 output_token_logprobs for 2 output_ids"),
        (generate_body([1]), "no output_token_logprobs"),
    ],
)
def test_malformed_generate_responses_are_rejected(body, match):
    with pytest.raises(ValueError, match=match):
        parse_generate_response(body, return_logprob=True)


def test_unfinished_response_is_rejected():
    body = generate_body([1])
    body["meta_info"]["finish_reason"] = None
    with pytest.raises(ValueError, match="has not finished"):
        parse_generate_response(body, return_logprob=False)


def test_generate_payload():
    payload = build_generate_payload(np.array([3, 4]), {"temperature": 0}, return_logprob=True, rid="r")
    assert payload == {"input_ids": [3, 4], "sampling_params": {"temperature": 0}, "return_logprob": True, "rid": "r"}
    assert type(payload["input_ids"][0]) is int  # JSON-serializable
    assert build_generate_payload([1]) == {"input_ids": [1], "sampling_params": {}}
    # --lora-sync adapter: the engines serve the policy as base + this adapter, which each request names
    assert build_generate_payload([1], adapter="policy")["lora_path"] == "policy"
    assert build_score_payload([1, 2], 3, "policy")["lora_path"] == "policy"
    assert "lora_path" not in build_score_payload([1, 2])


@pytest.mark.parametrize("input_ids", [[], "hello", [[1, 2], [3]], [1.5], None])
def test_generate_payload_rejects_what_is_not_one_prompt_of_ids(input_ids):
    with pytest.raises(ValueError, match="input_ids"):
        build_generate_payload(input_ids)


@pytest.mark.parametrize(
    "response, expected",
    [
        (httpx.Response(400, json={"object": "error", "message": "bad sampling", "code": 400}), "bad sampling"),
        (httpx.Response(422, json={"detail": [{"loc": ["body"], "msg": "field required"}]}), "field required"),
        (httpx.Response(400, json={"success": False, "error": {"message": "nested"}}), "nested"),
        (httpx.Response(500, text="plain failure"), "plain failure"),
        (httpx.Response(503, text=""), "Service Unavailable"),
    ],
)
def test_error_message_extracts_the_servers_explanation(response, expected):
    assert expected in error_message(response)


def test_check_success_raises_with_the_message():
    check_success({"success": True, "message": "ok"}, RuntimeError)
    check_success({"message": "no success field"}, RuntimeError)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        check_success({"success": False, "message": "shape mismatch"}, RuntimeError)


# ---------------------------------------------------------------- bad answers (issue 12: bad input)
@pytest.mark.parametrize(
    "body, match",
    [
        ({"text": "x", "output_ids": [1, 2]}, r"missing field 'meta_info'"),
        ({"output_ids": [1], "meta_info": ["not", "an", "object"]}, "meta_info must be an object, got list"),
        ({"output_ids": "12", "meta_info": {}}, "output_ids must be a list of token ids"),
        (generate_body([1, 2], [[-0.1, 1, None], [-0.2, 2, None], [-0.3, 3, None]]),
         "3 output_token_logprobs for 2 output_ids"),
        (generate_body([1], {"not": "a list"}), "dict output_token_logprobs for 1 output_ids"),
        (generate_body([1], [["nan?", 1]]), r"entries must be \[logprob, id, text\]"),
        ({"object": "error", "message": "The engine is overloaded", "code": 503},
         "the server answered an error: The engine is overloaded"),
        ({"error": {"message": "input too long"}}, "the server answered an error: input too long"),
    ],
)
def test_bad_generate_answers_say_what_is_wrong(body, match):
    with pytest.raises(ValueError, match=match):
        parse_generate_response(body, return_logprob=True)


def _client_answering(monkeypatch, status, content: bytes):
    import asyncio

    from lean_rl.backends.sglang.client import EngineClient
    from lean_rl.backends.sglang.client_errors import EngineError

    client = EngineClient("http://router.test:30000")
    http = httpx.AsyncClient(base_url=client.base_url,
                             transport=httpx.MockTransport(lambda request: httpx.Response(status, content=content)))
    monkeypatch.setattr(client, "_client", lambda: http)
    with pytest.raises(EngineError) as info:
        asyncio.run(client.generate([1, 2], {"max_new_tokens": 2}, return_logprob=True))
    return str(info.value)


@pytest.mark.parametrize(
    "status, content, match",
    [
        (200, b"<html>502 Bad Gateway</html>", "the body is not JSON \\(HTTP 200\\): '<html>502"),
        (200, b'{"object": "error", "message": "KV cache full"}', "the server answered an error: KV cache full"),
        (200, b'{"output_ids": [1]}', "missing field 'meta_info'"),
        (200, b"\xff\xfe\x00garbage", "the body is not JSON"),
        (500, b'{"message": "boom"}', "HTTP 500: boom"),
    ],
)
def test_bad_generate_answers_name_the_url_and_endpoint(monkeypatch, status, content, match):
    message = _client_answering(monkeypatch, status, content)
    assert message.startswith("http://router.test:30000/generate: "), message
    assert __import__("re").search(match, message), message


def test_request_bodies_encode_as_json_dumps_reads_them():
    import json

    from lean_rl.backends.sglang.responses import encode_json_body

    body = {"input_ids": [np.int64(3), 4], "sampling_params": {"temperature": np.float64(0.5), "top_p": 1.0,
                                                                "stop": ("a", "b")}, "rid": None, "flag": True}
    assert json.loads(encode_json_body(body)) == {"input_ids": [3, 4], "rid": None, "flag": True,
                                                  "sampling_params": {"temperature": 0.5, "top_p": 1.0,
                                                                      "stop": ["a", "b"]}}
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode_json_body({"bad": object()})
