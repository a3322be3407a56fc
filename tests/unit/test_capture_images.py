"""Image content parts on the capture endpoint (openai_capture/image_parts.py, image_tokens.py,
session_tokens.py): parsing and its one-line errors, rendering = the processor's expansion, the engine's
collapsed ids, and a second turn's prompt = the first turn's ids + the new ones. The tiny VLM's processor
(no weights) saved to a folder, as a checkpoint holds it; the engine is the slow integration test's
(tests/integration/test_vlm_generation.py)."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from lean_rl.rollout.openai_capture.chat import RequestError, parse_chat_request
from lean_rl.rollout.openai_capture.image_parts import take_image_parts
from lean_rl.rollout.openai_capture.image_tokens import expand_image_pads
from lean_rl.rollout.openai_capture.session_tokens import SessionTokens
from lean_rl.testing.tiny_vlm import build_processor


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("capture_vlm")
    build_processor().save_pretrained(path)
    return path


@pytest.fixture
def tokens(vlm_dir):
    from lean_rl.buffer.images import load_processor

    return SessionTokens(load_processor(str(vlm_dir)).tokenizer, str(vlm_dir))


def _data_url(size=(84, 56), colour="red") -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def _user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def _request(*messages):
    return parse_chat_request({"messages": list(messages)})


def test_image_parts_become_template_parts_in_order():
    text_only = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    messages, images = take_image_parts([text_only, _user({"type": "text", "text": "a"}, _image_part("x.png"),
                                                          _image_part("file:///y.png"))])
    assert messages[0] is text_only
    assert messages[1]["content"] == [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "image"}]
    assert [(i.where, i.url) for i in images] == [("messages[1].content[1].image_url.url", "x.png"),
                                                  ("messages[1].content[2].image_url.url", "file:///y.png")]


@pytest.mark.parametrize("message, error", [
    (_user(_image_part("https://example.com/a.png")),
     r"^messages\[0\].content\[0\].image_url.url: 'https://example.com/a.png': remote image URLs are not fetched"),
    (_user({"type": "image_url", "image_url": "a.png"}), r"^messages\[0\].content\[0\].image_url: expected"),
    (_user({"type": "image_url", "image_url": {"url": ""}}), r"^messages\[0\].content\[0\].image_url: expected"),
    ({"role": "system", "content": [_image_part("a.png")]}, r"^messages\[0\].content: image_url parts are taken in user"),
])
def test_malformed_or_remote_parts_are_one_line_naming_the_part(message, error):
    with pytest.raises(RequestError, match=error) as err:
        take_image_parts([message])
    assert "\n" not in str(err.value)


def test_expansion_repeats_each_pad_by_its_image():
    assert expand_image_pads([1, 5, 2, 5, 3], 5, [2, 3]) == [1, 5, 5, 2, 5, 5, 5, 3]
    with pytest.raises(RequestError, match="holds 2 image pad token"):
        expand_image_pads([5, 5], 5, [4])


def test_an_image_prompt_is_the_processors_expansion_and_the_engine_gets_one_pad_each(tokens, vlm_dir):
    from lean_rl.buffer.images import load_image, load_processor

    red, blue = _data_url(), _data_url((112, 100), "blue")
    chat = tokens.render(_request(_user(_image_part(red), {"type": "text", "text": "and"}, _image_part(red),
                                        {"type": "text", "text": "then"}, _image_part(blue))))
    ids = tokens.prompt_ids(chat)
    processor = load_processor(str(vlm_dir))
    images = [load_image(u) for u in (red, red, blue)]
    expected = processor(text=[chat.text], images=images, return_tensors="np")
    assert ids == expected["input_ids"][0].tolist()
    assert chat.image_refs == (red, red, blue) and chat.image_keys[0] == chat.image_keys[1] != chat.image_keys[2]
    prompt = tokens.engine_prompt(ids, chat)
    pad = processor.image_token_id
    assert prompt.input_ids == tokens.encode(chat.text) and prompt.input_ids.count(pad) == 3
    assert prompt.image_data == [chat.images[0].data_uri] * 2 + [chat.images[2].data_uri]


def test_a_second_turn_is_the_first_turns_ids_plus_the_new_ones(tokens, tmp_path):
    path = tmp_path / "blue.png"
    Image.new("RGB", (56, 84), "blue").save(path)
    first_turn = [_user(_image_part(_data_url()), {"type": "text", "text": "count"})]
    chat = tokens.render(_request(*first_turn))
    first_ids = tokens.prompt_ids(chat)
    output = tokens.encode("two") + [tokens.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    message = {"role": "assistant", "content": "two"}
    tokens.remember(tokens.engine_prompt(first_ids, chat), first_ids, output, message, "two", chat)

    second = tokens.render(_request(*first_turn, message, _user({"type": "text", "text": "now"},
                                                                 _image_part(f"file://{path}"))))
    second_ids = tokens.prompt_ids(second)
    assert second_ids[:len(first_ids) + len(output)] == first_ids + output
    assert len(second.images) == 2 and second.image_keys[0] == chat.image_keys[0]
    assert tokens.engine_prompt(second_ids, second).image_data[1] == second.images[1].data_uri
    # the same text with another first picture of the same size: not the first turn's ids
    other = tokens.render(_request(_user(_image_part(_data_url(colour="green")), {"type": "text", "text": "count"}),
                                   message, _user({"type": "text", "text": "now"}, _image_part(str(path)))))
    assert other.text == second.text and other.image_keys[0] != chat.image_keys[0]
    assert tokens.prompt_ids(other) == second_ids  # tokenized afresh: the same ids here, not spliced


@pytest.mark.parametrize("url, error", [
    ("/nope/x.png", r"^messages\[1\].content\[0\].image_url.url: '/nope/x.png': no such file$"),
    ("data:image/png;base64,AAAA", r"^messages\[1\].content\[0\].image_url.url: 'data:image/png;base64,AAAA': cannot"),
    ("data:image/png,raw", r"^messages\[1\].content\[0\].image_url.url: .*must be base64"),
])
def test_a_bad_image_is_one_line_naming_the_part(tokens, url, error):
    with pytest.raises(RequestError, match=error) as err:
        tokens.render(_request({"role": "system", "content": "s"}, _user(_image_part(url))))
    assert "\n" not in str(err.value) and err.value.param == "messages[1].content[0].image_url.url"


def test_the_image_token_written_as_text_is_refused(tokens):
    chat = tokens.render(_request(_user(_image_part(_data_url()), {"type": "text", "text": "<|image_pad|>"})))
    with pytest.raises(RequestError, match="holds 2 image pad token"):
        tokens.prompt_ids(chat)


def test_a_text_model_takes_no_images(tiny_qwen2):
    from lean_rl.buffer.prompt_source import load_tokenizer

    tokens = SessionTokens(load_tokenizer(str(tiny_qwen2)), str(tiny_qwen2))
    with pytest.raises(RequestError, match=r"^messages\[0\].content\[0\].image_url.url: the served model .* takes no"):
        tokens.render(_request(_user(_image_part(_data_url()))))
    assert tokens.prompt_ids(tokens.render(_request({"role": "user", "content": "hi"}))) == \
        tokens.encode(tokens.render(_request({"role": "user", "content": "hi"})).text)


def test_the_train_inputs_are_the_processors_for_the_samples_images(tokens, vlm_dir):
    from lean_rl.buffer.images import load_image, load_processor
    from lean_rl.sample import Sample

    red, blue = _data_url(), _data_url((112, 100), "blue")
    tokens.render(_request(_user(_image_part(red), _image_part(blue))))
    sample = Sample(index=0, group_index=0, prompt="p", tokens=[1], multimodal_inputs={"images": [red, blue]})
    tokens.images.fill_train_inputs(sample)
    expected = load_processor(str(vlm_dir)).image_processor(images=[load_image(red), load_image(blue)],
                                                            return_tensors="np")
    assert np.array_equal(sample.multimodal_train_inputs["pixel_values"], expected["pixel_values"])
    assert sample.multimodal_train_inputs["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
