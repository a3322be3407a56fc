"""Tool calls in the Hermes / Qwen2.5 format: parsing generated text, rendering conversations."""

import copy
import json

import pytest

from lean_rl.rollout.tool_calls import (ToolCall, format_tool_call, parse_tool_calls, render_chat,
                                        tools_system_prompt)
from lean_rl.testing.tiny_model import build_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

# A tool-aware template shaped like Qwen2.5's (its tool parts verbatim in structure): tools in the
# system turn, assistant tool_calls as <tool_call> blocks, tool results as <tool_response> in a user turn.
QWEN25_LIKE_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{%- else %}You are helpful.{%- endif %}"
    "{{ '\n\n# Tools\n<tools>' }}{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' %}{{ '<|im_start|>assistant' }}"
    "{%- if message.content %}{{ '\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{ '\n<tool_call>\n{\"name\": \"' }}{{ tool_call.name }}{{ '\", \"arguments\": ' }}"
    "{{ tool_call.arguments | tojson }}{{ '}\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)


# ---------------------------------------------------------------- parse
def test_one_call_with_text_around():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    parsed = parse_tool_calls(text)
    assert parsed.errors == ()
    assert parsed.content == "Let me look."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Paris"})]
    assert parsed.calls[0].id.startswith("call_")


def test_several_calls_get_distinct_ids_and_keep_the_text_between():
    text = ("a " + format_tool_call("f", {"x": 1}) + " b " + format_tool_call("g", {}) + " c")
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", {"x": 1}), ("g", {})]
    assert parsed.content == "a  b  c"
    assert len({c.id for c in parsed.calls}) == 2


def test_no_call_is_the_text_stripped():
    parsed = parse_tool_calls("  just an answer \n")
    assert parsed == type(parsed)(content="just an answer", calls=(), errors=())


def test_braces_and_closing_tag_inside_json_strings():
    args = {"code": "if x { return '}' } </tool_call> {", "nested": {"a": [1, {"b": "}"}]}}
    text = f'<tool_call>{json.dumps({"name": "run", "arguments": args})}</tool_call>done'
    parsed = parse_tool_calls(text)
    assert parsed.errors == ()
    assert parsed.calls[0].arguments == args
    assert parsed.content == "done"


def test_missing_arguments_means_no_arguments():
    parsed = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>')
    assert parsed.calls[0].arguments == {} and parsed.errors == ()


@pytest.mark.parametrize("body, error", [
    ('{"name": "f", "arguments": {"x": 1}', "bad JSON"),  # unbalanced brace
    ("not json at all", "bad JSON"),
    ('{"arguments": {"x": 1}}', 'missing "name"'),
    ('{"name": "", "arguments": {}}', 'missing "name"'),
    ('{"name": "f", "arguments": "{\\"x\\": 1}"}', '"arguments" must be a JSON object, got str'),
    ('{"name": "f", "arguments": [1]}', '"arguments" must be a JSON object, got list'),
    ('["f", {}]', "expected a JSON object, got list"),
    ('{"name": "f", "arguments": {}} trailing', "text after the JSON object"),
])
def test_malformed_call_is_reported_and_its_text_kept(body, error):
    good = format_tool_call("ok", {"y": 2})
    text = f"before <tool_call>{body}</tool_call> {good} after"
    parsed = parse_tool_calls(text)
    assert len(parsed.errors) == 1 and error in parsed.errors[0], parsed.errors
    assert [c.name for c in parsed.calls] == ["ok"]
    assert f"<tool_call>{body}</tool_call>" in parsed.content
    assert parsed.content.startswith("before") and parsed.content.endswith("after")


@pytest.mark.parametrize("text", ['x <tool_call>{"name": "f", "arguments": {"a": 1}}',
                                  'x <tool_call>{"name": "f", "argu'])
def test_unclosed_tag(text):
    parsed = parse_tool_calls(text)
    assert parsed.calls == () and len(parsed.errors) == 1 and "no closing </tool_call>" in parsed.errors[0]
    assert parsed.content == text


def test_tool_call_to_openai_has_arguments_as_json_string():
    call = ToolCall(name="f", arguments={"a": [1, "é"]}, id="call_1")
    out = call.to_openai()
    assert out == {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, "é"]}'}}
    assert json.loads(out["function"]["arguments"]) == call.arguments


# ---------------------------------------------------------------- render
@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)  # the tiny model's: Qwen-style template that renders any role name


@pytest.fixture(scope="module")
def tool_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN25_LIKE_TEMPLATE
    return tok


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
]


def test_tools_system_prompt_lists_every_tool_and_the_format():
    prompt = tools_system_prompt([WEATHER])
    assert json.dumps(WEATHER) in prompt and "<tool_call>" in prompt and '"arguments"' in prompt
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        tools_system_prompt([{"name": "f"}])


def test_render_without_tools_is_the_template(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(tokenizer, messages, None) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert render_chat(tokenizer, messages, None, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_render_plain_template_merges_tools_into_the_system_message_and_writes_calls(tokenizer):
    text = render_chat(tokenizer, CONVERSATION, [WEATHER])
    assert text == (
        "<|im_start|>system\nBe brief.\n\n" + tools_system_prompt([WEATHER]) + "<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n" + format_tool_call("get_weather", {"city": "Paris"}) + "<|im_end|>\n"
        "<|im_start|>tool\nsunny<|im_end|>\n"
        "<|im_start|>assistant\n")
    # no system message: one is added in front
    text = render_chat(tokenizer, CONVERSATION[1:2], [WEATHER])
    assert text.startswith("<|im_start|>system\n" + tools_system_prompt([WEATHER]) + "<|im_end|>\n<|im_start|>user\n")


def test_render_content_and_calls_together(tokenizer):
    messages = [{"role": "user", "content": "q"}, {**CONVERSATION[2], "content": "Checking."}]
    text = render_chat(tokenizer, messages, None, add_generation_prompt=False)
    assert "<|im_start|>assistant\nChecking.\n" + format_tool_call("get_weather", {"city": "Paris"}) in text


def test_render_tool_aware_template_gets_tools_and_calls_natively(tool_tokenizer):
    text = render_chat(tool_tokenizer, CONVERSATION, [WEATHER])
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n" + json.dumps(WEATHER) + "\n</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    # the template writes a call as the model does: parsing it back gives the call
    parsed = parse_tool_calls(text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0])
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Paris"})]


def test_render_text_parts(tokenizer):
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "user\nab<|im_end|>" in render_chat(tokenizer, messages)


@pytest.mark.parametrize("messages, field", [
    ([], r"messages: expected a non-empty list"),
    ("hi", r"messages: expected a non-empty list"),
    ([{"content": "x"}], r"messages\[0\]\.role"),
    (["x"], r"messages\[0\]: expected an object"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\.content"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], r"messages\[0\]\.content\[0\]"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
     r"messages\[0\]\.tool_calls\[0\]\.function\.arguments"),
    ([{"role": "assistant", "tool_calls": [{"type": "function"}]}], r"messages\[0\]\.tool_calls\[0\]"),
    ([{"role": "assistant", "tool_calls": "f"}], r"messages\[0\]\.tool_calls"),
])
def test_render_bad_messages_name_the_field(tokenizer, messages, field):
    with pytest.raises(ValueError, match=field):
        render_chat(tokenizer, messages)


def test_render_bad_tools_name_the_field(tokenizer):
    with pytest.raises(ValueError, match=r"tools\[1\]\.function\.name"):
        render_chat(tokenizer, [{"role": "user", "content": "x"}],
                    [WEATHER, {"type": "function", "function": {"name": 3}}])
    with pytest.raises(ValueError, match=r"tools: expected a list"):
        render_chat(tokenizer, [{"role": "user", "content": "x"}], {"type": "function"})
