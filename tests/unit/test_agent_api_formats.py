"""The Responses and Messages wire formats of the capture endpoint (pure): requests translated into
chat-completions bodies, answers into each API's objects and event streams."""

import json

import pytest

from lean_rl.rollout.openai_capture.chat import Completion, RequestError, parse_chat_request
from lean_rl.rollout.openai_capture.messages import (anthropic_error, chat_body_of_messages_request, message_body,
                                                     message_events)
from lean_rl.rollout.openai_capture.responses import (chat_body_of_response_request, response_body,
                                                      response_events)

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def test_a_response_request_is_a_chat_request_with_instructions_tools_and_tool_items():
    chat, history = chat_body_of_response_request({
        "instructions": "be brief", "max_output_tokens": 5, "temperature": 0.5,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                  {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'},
                  {"type": "function_call_output", "call_id": "call_1", "output": "42"}]}, {})
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "ok", "tool_calls": [CALL]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert history == chat["messages"][1:]  # instructions are not carried by previous_response_id
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    request = parse_chat_request(chat)
    assert request.max_tokens == 5 and request.temperature == 0.5 and request.parse_tools


def test_previous_response_id_prefixes_its_history_and_an_unknown_one_is_a_404():
    stored = {"resp_1": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    chat, _ = chat_body_of_response_request({"input": "c", "previous_response_id": "resp_1"}, stored)
    assert [m["content"] for m in chat["messages"]] == ["a", "b", "c"]
    with pytest.raises(RequestError) as info:
        chat_body_of_response_request({"input": "c", "previous_response_id": "resp_2"}, stored)
    assert info.value.status == 404 and info.value.param == "previous_response_id"


@pytest.mark.parametrize("body, param", [({}, "input"), ({"input": [{"type": "image"}]}, "input[0].type"),
                                         ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
                                         ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type")])
def test_bad_response_requests_name_the_field(body, param):
    with pytest.raises(RequestError) as info:
        chat_body_of_response_request(body, {})
    assert info.value.param == param


def test_a_response_and_its_events():
    completion = Completion({"role": "assistant", "content": "hi", "tool_calls": [CALL]}, "tool_calls", ())
    body = response_body("resp_1", "m", completion, 10, 3)
    assert [item["type"] for item in body["output"]] == ["message", "function_call"]
    assert body["output"][1]["call_id"] == "call_1" and body["usage"]["total_tokens"] == 13
    assert body["status"] == "completed"
    events = response_events(body)
    assert events[0][0] == "response.created" and events[-1] == ("response.completed", events[-1][1])
    assert [e[1]["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(d["delta"] for k, d in events if k == "response.output_text.delta") == "hi"
    cut = response_body("resp_2", "m", Completion({"role": "assistant", "content": "x"}, "length", ()), 1, 1)
    assert cut["status"] == "incomplete" and response_events(cut)[-1][0] == "response.incomplete"


def test_a_messages_request_is_a_chat_request_with_system_tool_use_and_tool_result():
    chat = chat_body_of_messages_request({
        "max_tokens": 7, "system": [{"type": "text", "text": "be brief"}], "stop_sequences": ["END"],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                       {"type": "tool_use", "id": "call_1", "name": "f",
                                                        "input": {"a": 1}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "42"},
                                                  {"type": "text", "text": "and?"}]}]})
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "ok", "tool_calls": [CALL]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                                {"role": "user", "content": "and?"}]
    request = parse_chat_request(chat)
    assert request.max_tokens == 7 and request.stop == ("END",) and request.tools[0]["function"]["name"] == "f"


@pytest.mark.parametrize("body, param", [({"messages": []}, "max_tokens"), ({"max_tokens": 1}, "messages"),
                                         ({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]},
                                          "messages.0.role"),
                                         ({"max_tokens": 1, "messages": [{"role": "user", "content": [
                                             {"type": "tool_use"}]}]}, "messages.0.content.0.type")])
def test_bad_messages_requests_name_the_field(body, param):
    with pytest.raises(RequestError) as info:
        chat_body_of_messages_request(body)
    assert info.value.param == param


def test_a_message_its_stop_reasons_and_its_events():
    body = message_body("msg_1", "m", Completion({"role": "assistant", "content": "hi", "tool_calls": [CALL]},
                                                 "tool_calls", ()), 10, 3, [])
    assert body["content"] == [{"type": "text", "text": "hi"},
                               {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}]
    assert body["stop_reason"] == "tool_use" and body["usage"] == {"input_tokens": 10, "output_tokens": 3}
    stopped = message_body("msg_2", "m", Completion({"role": "assistant", "content": "x"}, "stop", (), "END"),
                           1, 1, ["END"])
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    cut = message_body("msg_3", "m", Completion({"role": "assistant", "content": "x"}, "length", ()), 1, 1, [])
    assert cut["stop_reason"] == "max_tokens"
    kinds = [k for k, _ in message_events(body)]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    deltas = [d["delta"] for k, d in message_events(body) if k == "content_block_delta"]
    assert deltas[0]["text"] == "hi" and json.loads(deltas[1]["partial_json"]) == {"a": 1}


def test_an_openai_error_in_the_anthropic_shape():
    assert anthropic_error({"error": {"message": "bad", "type": "invalid_request_error"}}, 400) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert anthropic_error({"error": {"message": "x"}}, 503)["error"]["type"] == "overloaded_error"
