"""slime.utils.mask_utils as lean_rl serves it: MultiTurnLossMaskGenerator called as slime's
rollout-buffer example calls it, against masks written out by hand, piece by piece, for the tiny
model's ChatML template, a Qwen2.5-style template (default system prompt), and a DeepSeek-R1-distill
style tokenizer."""

from __future__ import annotations

import copy

import pytest

from lean_rl.testing.tiny_model import build_tokenizer
from lean_rl.utils.slime_finder import install_slime_finder

install_slime_finder()

from slime.utils.mask_utils import MultiTurnLossMaskGenerator, get_response_lengths  # noqa: E402

QWEN25_STYLE = (  # Qwen2.5's shape: a default system message when the chat has none
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DISTILL_STYLE = (  # DeepSeek-R1-Distill's shape: role tokens, no end of turn after the user
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% else %}{{ '<｜Assistant｜>' + m['content'] + '<|im_end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\n' }}{% endif %}"
)
REWRITES_EARLIER_TURNS = (  # Qwen3's habit: an assistant turn before the last user turn is shortened
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\nearlier<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chatml():
    return build_tokenizer(512)  # the tiny model's tokenizer and template


def with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


def pieces(tokenizer, *parts: tuple[str, int]) -> tuple[list[int], list[int]]:
    """Token ids and mask written out piece by piece: (text, 0 or 1) each."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in parts:
        part = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += part
        mask += [trained] * len(part)
    return ids, mask


def slime_style_sample(tokenizer, loss_mask_type, oai_messages):
    """What rollout_buffer_example.py does with one record of the buffer server."""
    mask_generator = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type=loss_mask_type)
    token_ids, loss_mask = mask_generator.get_loss_mask(oai_messages)
    response_length = mask_generator.get_response_lengths([loss_mask])[0]
    loss_mask = loss_mask[-response_length:]
    return token_ids, response_length, loss_mask


def test_single_turn_chatml_trains_the_answer_and_its_end_of_turn(chatml):
    messages = [{"role": "user", "content": "what is 2 + 3"}, {"role": "assistant", "content": "5"}]
    token_ids, response_length, loss_mask = slime_style_sample(chatml, "qwen", messages)
    ids, mask = pieces(chatml, ("<|im_start|>user\nwhat is 2 + 3<|im_end|>\n<|im_start|>assistant\n", 0),
                       ("5<|im_end|>\n", 1))
    assert token_ids == ids
    assert response_length == sum(mask) == len(chatml("5<|im_end|>\n", add_special_tokens=False)["input_ids"])
    assert loss_mask == [1] * response_length


def test_multi_turn_masks_only_assistant_turns_and_honours_step_loss_mask(chatml):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": "call sum"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "a wrong turn", "step_loss_mask": 0},
        {"role": "user", "content": "final?"},
        {"role": "assistant", "content": "the answer is 5"},
    ]
    token_ids, loss_mask = MultiTurnLossMaskGenerator(chatml, "qwen3").get_loss_mask(messages)
    ids, mask = pieces(
        chatml,
        ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nadd 2 and 3<|im_end|>\n<|im_start|>assistant\n", 0),
        ("call sum<|im_end|>\n", 1),
        ("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\na wrong turn<|im_end|>\n", 0),
        ("<|im_start|>user\nfinal?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("the answer is 5<|im_end|>\n", 1),
    )
    assert (token_ids, loss_mask) == (ids, mask)
    # slime's response: from the first trained token to the end, the tool turn inside it untrained
    response_length = get_response_lengths([loss_mask])[0]
    assert response_length == len(ids) - mask.index(1)
    assert 0 in loss_mask[-response_length:]
    texts = MultiTurnLossMaskGenerator(chatml, "qwen3").get_text_from_loss_mask(token_ids, loss_mask)
    assert texts == ["call sum<|im_end|>\n", "the answer is 5<|im_end|>\n"]


def test_default_system_prompt_is_in_the_ids_and_never_trained(chatml):
    tok = with_template(chatml, QWEN25_STYLE)
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yes"}]
    token_ids, response_length, loss_mask = slime_style_sample(tok, "qwen", messages)
    ids, mask = pieces(tok, ("<|im_start|>system\nYou are helpful.<|im_end|>\n", 0),
                       ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", 0), ("yes<|im_end|>\n", 1))
    assert token_ids == ids
    assert response_length == sum(mask) and loss_mask == [1] * response_length


def test_distill_tokenizer_trains_the_last_content_without_an_end_of_turn(chatml):
    tok = with_template(chatml, DISTILL_STYLE)
    tok.add_special_tokens({"additional_special_tokens": ["<｜User｜>", "<｜Assistant｜>"]})
    messages = [{"role": "user", "content": "what is 2 + 3"}, {"role": "assistant", "content": "the answer is 5"}]
    ids, mask = pieces(tok, ("<|endoftext|><｜User｜>what is 2 + 3<｜Assistant｜><think>\n", 0),
                       ("the answer is 5", 1))
    for loss_mask_type in ("distill_qwen", "qwen"):  # "qwen" recognises the distill tokenizer
        token_ids, response_length, loss_mask = slime_style_sample(tok, loss_mask_type, messages)
        assert token_ids == ids
        assert response_length == sum(mask) and loss_mask == [1] * response_length
    untrained = [messages[0], {**messages[1], "step_loss_mask": 0}]
    token_ids, loss_mask = MultiTurnLossMaskGenerator(tok, "distill_qwen").get_loss_mask(untrained)
    assert token_ids == ids and loss_mask == [0] * len(ids)
    assert get_response_lengths([loss_mask]) == [0]


def test_get_response_lengths_counts_from_the_first_trained_token():
    assert get_response_lengths([[0, 0, 1, 0, 1], [0, 0], [1], []]) == [3, 0, 1, 0]


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_message(chatml):
    tok = with_template(chatml, REWRITES_EARLIER_TURNS)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(ValueError, match=r"messages\[:2\].*assistant message 1"):
        MultiTurnLossMaskGenerator(tok, "qwen").get_loss_mask(messages)
    # a single turn is not rewritten: it is served
    token_ids, loss_mask = MultiTurnLossMaskGenerator(tok, "qwen").get_loss_mask(messages[:2])
    assert (token_ids, loss_mask) == pieces(tok, ("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n", 0),
                                            ("b<|im_end|>\n", 1))


def test_unknown_type_and_bad_chats_are_refused(chatml):
    with pytest.raises(ValueError, match="--loss-mask-type 'llama'"):
        MultiTurnLossMaskGenerator(chatml, tokenizer_type="llama")
    with pytest.raises(ValueError, match=r"messages\[0\] is an assistant"):
        MultiTurnLossMaskGenerator(chatml).get_loss_mask([{"role": "assistant", "content": "x"}])
    distill = with_template(chatml, DISTILL_STYLE)  # its generation prompt adds <think>, its chats do not
    with pytest.raises(ValueError, match=r"assistant message 1 does not follow .*<think>"):
        MultiTurnLossMaskGenerator(distill, "qwen3").get_loss_mask([{"role": "user", "content": "a"},
                                                                   {"role": "assistant", "content": "b"}])
    with pytest.raises(ValueError, match="messages is empty"):
        MultiTurnLossMaskGenerator(chatml).get_loss_mask([])
