"""The OpenAI capture endpoint's pure parts: calls -> Samples (trajectory.py) and the chat-completions
wire format (chat.py)."""

import json

import pytest

from lean_rl.rollout.openai_capture.chat import (RequestError, as_sampled, chat_completion_body,
                                                 completion_from_output, error_body, message_signature,
                                                 parse_chat_request)
from lean_rl.rollout.openai_capture.trajectory import (FANOUT_STRIDE, CallRecord, TrajectoryAssembler,
                                                       fanout_index, splice_prompt_ids)
from lean_rl.sample import NOT_GENERATED, Sample, Status


def base_sample(index=7, group_index=3) -> Sample:
    return Sample(index=index, group_index=group_index, prompt="the question", tokens=[900, 901], label="x",
                  metadata={"prompt_row": 5})


def call(prompt, output, finish="stop", version=2) -> CallRecord:
    return CallRecord(prompt_ids=list(prompt), output_ids=list(output),
                      output_log_probs=[-0.1 * (i + 1) for i in range(len(output))],
                      weight_versions=[version] * len(output), finish_reason=finish)


# ---------------------------------------------------------------- assembly
def test_one_call_is_the_base_sample_with_the_calls_prompt():
    base = base_sample()
    asm = TrajectoryAssembler(base)
    asm.add(call([1, 2, 3], [10, 11]))
    [sample] = asm.samples(reward=0.5)
    assert sample is base
    assert sample.tokens == [1, 2, 3, 10, 11] and sample.prompt_length == 3
    assert sample.loss_mask == [1, 1] and sample.rollout_log_probs == pytest.approx([-0.1, -0.2])
    assert sample.weight_versions == [2, 2]
    assert sample.status == Status.COMPLETED and sample.reward == 0.5
    assert sample.metadata["capture_calls"][0]["prompt_tokens"] == 3


def test_calls_extending_the_previous_one_make_one_sample_with_context_masked():
    asm = TrajectoryAssembler(base_sample())
    asm.add(call([1, 2], [10, 11]))
    asm.add(call([1, 2, 10, 11, 20, 21, 22], [30], version=3))  # tool result / user turn 20-22
    asm.add(call([1, 2, 10, 11, 20, 21, 22, 30, 40], [50, 51], finish="length", version=3))
    [sample] = asm.samples()
    assert sample.tokens == [1, 2, 10, 11, 20, 21, 22, 30, 40, 50, 51]
    assert sample.response_tokens == [10, 11, 20, 21, 22, 30, 40, 50, 51]
    assert sample.loss_mask == [1, 1, 0, 0, 0, 1, 0, 1, 1]
    assert sample.weight_versions == [2, 2, NOT_GENERATED, NOT_GENERATED, NOT_GENERATED, 3, NOT_GENERATED, 3, 3]
    assert sample.rollout_log_probs[2:5] == [0.0, 0.0, 0.0]
    assert sample.status == Status.TRUNCATED  # the last call's finish reason
    assert [c["context_tokens"] for c in sample.metadata["capture_calls"]] == [0, 3, 1]
    sample.check()


def test_a_broken_prefix_starts_a_new_sample_of_the_same_group():
    base = base_sample(index=7, group_index=3)
    asm = TrajectoryAssembler(base)
    asm.add(call([1, 2], [10, 11]))
    asm.add(call([1, 2, 99, 20], [30]))  # the agent rewrote the model's turn: not a prefix
    asm.add(call([1, 2, 99, 20, 30, 40], [50], finish="length"))  # extends the second sample
    first, second = asm.samples(reward=1.0)
    assert first is base and first.tokens == [1, 2, 10, 11] and first.status == Status.COMPLETED
    assert second.tokens == [1, 2, 99, 20, 30, 40, 50] and second.prompt_length == 4
    assert second.loss_mask == [1, 0, 1] and second.status == Status.TRUNCATED
    assert second.group_index == 3 and second.index == fanout_index(7, 1) != 7
    assert second.metadata["parent_index"] == 7 and second.metadata["trajectory_part"] == 1
    assert second.metadata["prompt_row"] == 5 and second.label == "x" and second.prompt == "the question"
    assert first.reward == second.reward == 1.0
    assert first.metadata["trajectory_parts"] == second.metadata["trajectory_parts"] == 2
    assert len(first.metadata["capture_calls"]) == 1 and len(second.metadata["capture_calls"]) == 2


def test_a_call_extends_the_longest_matching_trajectory():
    asm = TrajectoryAssembler(base_sample())
    asm.add(call([1], [2]))  # sample 0: [1, 2]
    asm.add(call([1, 5], [6]))  # branches off: sample 1: [1, 5, 6]
    assert asm.add(call([1, 2, 3], [4])) == 0
    assert asm.add(call([1, 5, 6, 7], [8])) == 1
    assert asm.parent([1, 2, 3, 4, 9]) == 0 and asm.parent([1, 3]) is None
    a, b = asm.samples()
    assert a.tokens == [1, 2, 3, 4] and b.tokens == [1, 5, 6, 7, 8]


def test_two_branches_from_one_context_are_two_samples():
    asm = TrajectoryAssembler(base_sample())
    asm.add(call([1, 2], [3]))
    asm.add(call([1, 2], [4]))  # same prompt again (an agent sampling twice): [1, 2] is not a prefix tip
    a, b = asm.samples()
    assert a.tokens == [1, 2, 3] and b.tokens == [1, 2, 4]


def test_a_planner_and_two_solver_calls_form_a_tree_of_three_samples():
    asm = TrajectoryAssembler(base_sample())
    asm.add(call([1, 2], [3, 4]))  # node 0: the planner
    asm.add(call([7, 8], [9]))  # node 1: solver call 1 (its own system prompt: a root)
    asm.add(call([7, 8, 9, 5], [6]))  # node 2: solver 1 continues after a tool result
    asm.add(call([7, 7], [9, 9]))  # node 3: solver call 2, a root
    asm.add(call([1, 2, 3, 4, 20, 21], [30], version=3))  # node 4: the planner reads both answers
    assert asm.parents == [None, None, 1, None, 0]
    planner, solver1, solver2 = asm.samples(reward=0.8)
    assert planner.tokens == [1, 2, 3, 4, 20, 21, 30] and planner.loss_mask == [1, 1, 0, 0, 1]
    assert solver1.tokens == [7, 8, 9, 5, 6] and solver1.loss_mask == [1, 0, 1]
    assert solver2.tokens == [7, 7, 9, 9] and solver2.loss_mask == [1, 1]
    assert [s.reward for s in (planner, solver1, solver2)] == [0.8] * 3
    assert [s.loss_weight for s in (planner, solver1, solver2)] == pytest.approx([1 / 3] * 3)
    assert [(c["node"], c["parent_node"]) for c in planner.metadata["capture_calls"]] == [(0, None), (4, 0)]


def test_a_branch_from_the_middle_of_a_path_is_a_new_sample_trained_from_the_branch():
    asm = TrajectoryAssembler(base_sample())
    asm.add(call([1], [2]))  # node 0
    asm.add(call([1, 2, 3], [4]))  # node 1: first child of 0, same sample
    asm.add(call([1, 2, 5], [6]))  # node 2: second child of 0: a new sample, node 0's output is context
    assert asm.parents == [None, 0, 0]
    a, b = asm.samples()
    assert a.tokens == [1, 2, 3, 4] and a.loss_mask == [1, 0, 1]
    assert b.tokens == [1, 2, 5, 6] and b.prompt_length == 3 and b.loss_mask == [1]
    assert a.loss_weight == b.loss_weight == 0.5


def test_budget_accounting_and_truncation():
    asm = TrajectoryAssembler(base_sample())
    assert asm.response_length_after_prompt([1, 2]) == 0  # a new sample
    asm.add(call([1, 2], [3, 4]))
    assert asm.response_length_after_prompt([1, 2, 3, 4, 5, 6]) == 4  # 2 generated + 2 context
    asm.mark_truncated([1, 2, 3, 4, 5, 6])
    [sample] = asm.samples()
    assert sample.status == Status.TRUNCATED


def test_an_aborted_last_call_makes_the_sample_aborted():
    asm = TrajectoryAssembler(base_sample())
    asm.add(call([1], [2], finish="abort"))
    assert asm.samples()[0].status == Status.ABORTED


def test_a_base_with_a_partial_response_is_reset():
    base = base_sample()
    base.append_response([5, 6], log_probs=[0.0, 0.0], weight_versions=0)
    base.reward = 3.0
    asm = TrajectoryAssembler(base)
    asm.add(call([1], [2]))
    [sample] = asm.samples()
    assert sample.tokens == [1, 2] and sample.response_length == 1 and sample.reward is None


def test_fanout_index_cannot_collide():
    assert fanout_index(0, 1) == FANOUT_STRIDE and fanout_index(5, 2) == 2 * FANOUT_STRIDE + 5
    with pytest.raises(ValueError):
        fanout_index(5, 0)
    with pytest.raises(ValueError):
        fanout_index(FANOUT_STRIDE, 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(output_log_probs=[0.0]), "2 output ids but 1 log-probs"),
    (dict(finish_reason="eos"), "unknown finish reason"),
    (dict(prompt_ids=[]), "empty prompt"),
])
def test_call_record_checks(kwargs, message):
    fields = dict(prompt_ids=[1], output_ids=[2, 3], output_log_probs=[0.0, 0.0], weight_versions=[0, 0],
                  finish_reason="stop")
    with pytest.raises(ValueError, match=message):
        CallRecord(**{**fields, **kwargs})


# ---------------------------------------------------------------- the request
MESSAGES = [{"role": "user", "content": "hi"}]


def test_request_fields_are_read_and_unknown_ones_ignored():
    request = parse_chat_request({"model": "anything", "messages": MESSAGES, "temperature": 0.5, "top_p": 0.9,
                                  "max_tokens": 7, "stop": "</tool_call>", "n": 1, "seed": 3, "user": "u"})
    assert (request.temperature, request.top_p, request.max_tokens, request.stop) == (0.5, 0.9, 7, ("</tool_call>",))
    assert request.tools is None and not request.parse_tools
    assert parse_chat_request({"messages": MESSAGES, "max_completion_tokens": 4, "max_tokens": 9}).max_tokens == 4


def test_tools_and_tool_choice():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert parse_chat_request({"messages": MESSAGES, "tools": tools}).parse_tools
    assert parse_chat_request({"messages": MESSAGES, "tools": tools, "tool_choice": "auto"}).parse_tools
    assert not parse_chat_request({"messages": MESSAGES, "tools": tools, "tool_choice": "none"}).parse_tools


@pytest.mark.parametrize("body, param, text", [
    ([1], None, "must be a JSON object"),
    ({}, "messages", "missing required field 'messages'"),
    ({"messages": "hi"}, "messages", "non-empty list"),
    ({"messages": [{"role": 1}]}, "messages[0].role", "non-empty string"),
    ({"messages": MESSAGES, "n": 2}, "n", "only n=1"),
    ({"messages": MESSAGES, "stream": True}, "stream", "streaming is not supported"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature", "temperature must be a number"),
    ({"messages": MESSAGES, "temperature": 3}, "temperature", "[0, 2]"),
    ({"messages": MESSAGES, "top_p": 0}, "top_p", "(0, 1]"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "positive integer"),
    ({"messages": MESSAGES, "max_completion_tokens": 2.5}, "max_completion_tokens", "positive integer"),
    ({"messages": MESSAGES, "stop": [1]}, "stop", "stop must be"),
    ({"messages": MESSAGES, "tools": [{"name": "f"}]}, "tools[0]", "type"),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {}}], "tool_choice": "auto"},
     "tools[0].function.name", "non-empty string"),
    ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice", "not supported"),
])
def test_bad_requests_name_the_field(body, param, text):
    with pytest.raises(RequestError) as info:
        parse_chat_request(body)
    assert info.value.param == param and text in str(info.value) and info.value.status == 400


# ---------------------------------------------------------------- the answer
def test_plain_completion_keeps_the_text_and_cuts_a_matched_stop_string():
    c = completion_from_output(" hello world", "stop", None, parse_tools=False)
    assert c.message == {"role": "assistant", "content": " hello world"} and c.finish_reason == "stop"
    c = completion_from_output("answer END\n", "stop", "END", parse_tools=False)
    assert c.message["content"] == "answer "
    assert completion_from_output("abc", "length", 3, parse_tools=False).finish_reason == "length"


def test_tool_calls_in_the_answer():
    text = 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    c = completion_from_output(text, "stop", 2, parse_tools=True)
    assert c.finish_reason == "tool_calls" and c.message["content"] == "ok"
    [tc] = c.message["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "f"
    assert json.loads(tc["function"]["arguments"]) == {"a": 1} and tc["id"].startswith("call_")
    # only calls: content null; cut short by the length budget: finish_reason length
    c = completion_from_output('<tool_call>{"name": "f"}</tool_call>', "length", 5, parse_tools=True)
    assert c.message["content"] is None and c.finish_reason == "length"
    # parsing off (no tools / tool_choice none): the text as it is
    assert "tool_calls" not in completion_from_output(text, "stop", 2, parse_tools=False).message
    # a malformed call stays in the content and is reported
    c = completion_from_output("<tool_call>{bad}</tool_call>", "stop", 2, parse_tools=True)
    assert c.finish_reason == "stop" and "{bad}" in c.message["content"] and len(c.tool_call_errors) == 1


def test_chat_completion_body_has_the_openai_shape():
    c = completion_from_output("hi", "stop", None, parse_tools=False)
    body = chat_completion_body("chatcmpl-1", "m", c, prompt_tokens=5, completion_tokens=2, created=10)
    assert body == {"id": "chatcmpl-1", "object": "chat.completion", "created": 10, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                 "finish_reason": "stop", "logprobs": None}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    assert error_body("bad", "messages") == {"error": {"message": "bad", "type": "invalid_request_error",
                                                       "param": "messages", "code": None}}
    assert error_body("down", status=502)["error"]["type"] == "server_error"


def test_message_signature_identifies_an_answer_sent_back():
    answer = completion_from_output('<tool_call>{"name": "f"}</tool_call>', "stop", 2, parse_tools=True).message
    as_sent_back = {**json.loads(json.dumps(answer)), "refusal": None, "content": None}
    assert message_signature(as_sent_back) == message_signature(answer) == ("", (answer["tool_calls"][0]["id"],))
    assert message_signature({"role": "assistant", "content": "x", "tool_calls": None}) == ("x", ())
    assert message_signature({"role": "user", "content": "x"}) is None
    assert message_signature({"role": "assistant", "content": [{"type": "text", "text": "x"}]}) is None


# ---------------------------------------------------------------- history sent back
def test_an_answer_sent_back_is_rendered_from_the_sampled_text():
    sampled = 'checking <tool_call>{"name":"f","arguments":{"a":1}}</tool_call>'  # not the canonical JSON
    answer = completion_from_output(sampled, "stop", 2, parse_tools=True).message
    history = {message_signature(answer): sampled}
    sent_back = {**json.loads(json.dumps(answer)), "refusal": None}
    assert as_sampled(sent_back, history) == {"role": "assistant", "content": sampled, "refusal": None}
    # edited by the agent (other content, or other call ids): left as it is, rendered by the template
    edited = {**sent_back, "content": "something else"}
    assert as_sampled(edited, history) is edited
    other_call = {**sent_back, "tool_calls": [{**sent_back["tool_calls"][0], "id": "call_other"}]}
    assert as_sampled(other_call, history) is other_call
    user = {"role": "user", "content": sampled}
    assert as_sampled(user, history) is user


def test_splice_reuses_the_sampled_ids_and_encodes_only_the_rest():
    encoded = []

    def encode(text, skip):
        encoded.append((text, skip))
        return [ord(c) for c in text]

    tips = [("<a>hi", [1, 2, 3], ()), ("<a>hi there", [1, 2, 3, 4, 5], ())]  # ids the engine saw / sampled
    assert splice_prompt_ids("<a>hi there</a><b>", tips, encode) == [1, 2, 3, 4, 5] + [ord(c) for c in "</a><b>"]
    assert encoded == [("</a><b>", 0)]  # the longest tip; its text never re-encoded
    assert splice_prompt_ids("<a>hi", tips, encode) == [1, 2, 3]
    assert splice_prompt_ids("<a>ho", tips, encode) == [ord(c) for c in "<a>ho"]  # no tip: all encoded


def test_splice_with_images_needs_the_same_pictures_before_the_rest():
    def encode(text, skip):
        return [ord(c) for c in text] + [-skip]

    tips = [("<i>a", [9, 9, 9, 1], ("red",)), ("<i>a<i>b", [9, 9, 9, 1, 8, 8, 2], ("red", "blue"))]
    # the same first picture: its ids kept, the rest's images start after it
    assert splice_prompt_ids("<i>a<i>c", tips, encode, ("red", "green")) == [9, 9, 9, 1] + [ord(c) for c in "<i>c"] + [-1]
    assert splice_prompt_ids("<i>a<i>b!", tips, encode, ("red", "blue")) == [9, 9, 9, 1, 8, 8, 2, ord("!"), -2]
    # another picture in the same place (same text, same pads): nothing reused
    assert splice_prompt_ids("<i>a<i>b", tips, encode, ("pink", "blue")) == [ord(c) for c in "<i>a<i>b"] + [0]


def test_a_call_with_other_pictures_under_the_same_ids_starts_a_new_sample():
    base = base_sample()
    base.multimodal_inputs = {"images": ["row.png"]}  # a data row's image: the trajectory's own replace it
    assembler = TrajectoryAssembler(base)

    def image_call(prompt, output, images, keys):
        return CallRecord(list(prompt), list(output), [-0.5] * len(output), [1] * len(output), "stop",
                          images=tuple(images), image_keys=tuple(keys))

    assert assembler.add(image_call([5, 7, 7, 6], [10, 11], ["a.png"], ["ka"])) == 0
    assert base.multimodal_inputs == {"images": ["a.png"]}
    # the same picture sent as base64, and a second one: one sample, the new image in context
    assert assembler.add(image_call([5, 7, 7, 6, 10, 11, 5, 7, 7, 6], [12], ["data:a", "b.png"], ["ka", "kb"])) == 0
    assert base.multimodal_inputs == {"images": ["a.png", "b.png"], "prompt_images": 1}
    assert base.loss_mask == [1, 1, 0, 0, 0, 0, 1]
    # the same ids but another first picture: not a continuation
    assert assembler.add(image_call([5, 7, 7, 6, 10, 11, 9], [13], ["c.png"], ["kc"])) == 1
    # a text-only call: its sample has no images
    assert assembler.add(image_call([1, 2], [3], [], [])) == 2
    samples = assembler.samples()
    assert samples[1].multimodal_inputs == {"images": ["c.png"]} and samples[2].multimodal_inputs is None
    base.reset_response()  # the context's image goes with the response
    assert base.multimodal_inputs == {"images": ["a.png"]}
    with pytest.raises(ValueError, match="1 images but 0 image keys"):
        CallRecord([1], [2], [-1.0], [0], "stop", images=("a.png",))
