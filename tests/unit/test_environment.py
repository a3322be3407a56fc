"""The environment interface's pure parts: what reset/step may answer, and observation rendering with
the tiny model's real tokenizer and chat template."""

import pytest

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.environment import Observation, ObservationRenderer, StepResult, as_observation, as_step_result


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2):
    return load_tokenizer(str(tiny_qwen2))


def test_observation_forms():
    assert as_observation(None, "reset") is None
    assert as_observation("hi", "reset") == Observation(text="hi")
    assert as_observation([1, 2], "reset") == Observation(token_ids=(1, 2))
    with pytest.raises(TypeError, match="reset returned dict"):
        as_observation({"text": "hi"}, "reset")
    with pytest.raises(TypeError):
        as_observation([1, True], "step")
    with pytest.raises(ValueError, match="exactly one of text and token_ids"):
        Observation(text="a", token_ids=(1,))


def test_step_result_forms():
    assert as_step_result(("obs", 1.0, True)) == StepResult(Observation(text="obs"), 1.0, True, None)
    assert as_step_result(("obs", None, 0, {"k": 1})).info == {"k": 1}
    with pytest.raises(TypeError, match="step returned list"):
        as_step_result(["obs", 1.0, True])
    with pytest.raises(TypeError, match="reward '1'"):
        as_step_result(("obs", "1", False))


def test_chat_observation_is_the_templates_text_between_turns(tokenizer):
    renderer = ObservationRenderer(tokenizer, chat=True)
    ids, text = renderer.ids(Observation(text="result: 42", role="tool"), turn_end="<|im_end|>")
    assert text == "\n<|im_start|>tool\nresult: 42<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    # the model stopped without closing its turn (stop string, per-turn cap): the template closes it
    _, text = renderer.ids(Observation(text="result: 42", role="tool"))
    assert text.startswith("<|im_end|>\n<|im_start|>tool\n")
    # a turn that ended on another stop token (not the template's end of turn) does not drop it
    _, text = renderer.ids(Observation(text="result: 42", role="tool"), turn_end="<|endoftext|>")
    assert text.startswith("<|im_end|>\n")
    # a whole conversation rendered by the template equals prompt + turns + observations glued by ids
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"},
                {"role": "tool", "content": "result: 42"}]
    full = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    _, observation = renderer.ids(Observation(text="result: 42", role="tool"), turn_end="<|im_end|>")
    assert full == head + "a1<|im_end|>" + observation


def test_reset_observation_goes_before_the_generation_prompt(tokenizer):
    renderer = ObservationRenderer(tokenizer, chat=True)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    ids = renderer.prompt_with(prompt_ids, Observation(text="you are in a maze", role="user"))
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "q"}, {"role": "user", "content": "you are in a maze"}],
                                             tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids) == expected
    assert ids[:len(prompt_ids) - 3] == prompt_ids[:-3]  # the prompt's own ids are kept, not re-tokenized
    with pytest.raises(ValueError, match="does not end with the chat template's generation prompt"):
        renderer.prompt_with(prompt_ids[:-1], Observation(text="x"))
    plain = ObservationRenderer(tokenizer, chat=False)
    assert plain.prompt_with([5], Observation(text=" more")) == [5] + tokenizer.encode(" more", add_special_tokens=False)


def test_plain_and_token_observations(tokenizer):
    renderer = ObservationRenderer(tokenizer, chat=False)
    ids, text = renderer.ids(Observation(text=" result: 42"), turn_end="<|im_end|>")
    assert text == " result: 42" and tokenizer.decode(ids) == text
    assert renderer.ids(Observation(token_ids=(5, 6)))[0] == [5, 6]


def test_environment_path_turns_on_the_multi_turn_generate(tiny_qwen2, tmp_path):
    from lean_rl.config import parse_config
    from lean_rl.rollout.config import MULTI_TURN_GENERATE

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--environment-path", "envs.make"]
    cfg = parse_config(base + ["--max-turns", "3"])
    assert cfg.rollout.custom_generate_function_path == MULTI_TURN_GENERATE
    assert cfg.rollout.multi_turn.max_turns == 3 and cfg.rollout.multi_turn.environment_path == "envs.make"
    mine = parse_config(base + ["--custom-generate-function-path", "my.generate"])
    assert mine.rollout.custom_generate_function_path == "my.generate"  # the user's own multi-turn wins


def test_environment_path_is_checked_at_start_up(tiny_qwen2, tmp_path, monkeypatch):
    from lean_rl.config import parse_config
    from lean_rl.extensions import load_extensions
    from lean_rl.utils.plugins import PluginError

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    (tmp_path / "my_envs.py").write_text("async def make(cfg, sample):\n    pass\n\ndef two(cfg, sample):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--environment-path"]
    with pytest.raises(PluginError, match="--environment-path 'my_envs.nope'.*has no attribute 'nope'"):
        load_extensions(parse_config(base + ["my_envs.nope"]))
    with pytest.raises(PluginError, match="must be a plain `def`"):
        load_extensions(parse_config(base + ["my_envs.make"]))
    assert load_extensions(parse_config(base + ["my_envs.two"])).generate is not None
