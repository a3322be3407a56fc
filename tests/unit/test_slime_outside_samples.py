"""A slime rollout function's data source for finished Samples it built itself (slime_plugins/rollout_buffer's
shape): `add_samples` of groups without group_index (index = the instance id), `get_samples` hands them
back first, `get_buffer_length`, and `get_metadata` / `update_metadata` whose state outlives the call
and a checkpoint. The per-token versions come from the router gateway's record of the answers it
relayed (their text; a re-tokenized conversation keeps no ids). Our own functions in slime's style."""

import json

import pytest

from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.config import parse_config
from lean_rl.sample import NOT_GENERATED
from lean_rl.slime_compat.rollout_function import BufferDataSource
from lean_rl.slime_compat.router_gateway import relayed_text_versions
from lean_rl.slime_compat.run_state import bind_run
from lean_rl.utils.slime_finder import install_slime_finder

install_slime_finder()
from slime.utils.types import Sample  # noqa: E402  served by lean_rl

FLAG = "--rollout-function-path"


@pytest.fixture
def cfg(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "label": "4"}) + "\n" for i in range(4)))
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--n-samples-per-prompt", "2",
                        "--output-dir", str(tmp_path / "out")])
    cfg.engines.live.publish(["http://127.0.0.1:31001"], "http://127.0.0.1:31000")
    bind_run(cfg)
    return cfg


def built_outside(cfg, instance_id, answer: str, reward: float) -> Sample:
    """As rollout_buffer_example.py builds one: the conversation's ids, the answer's span trainable."""
    tokenizer = load_tokenizer(cfg.engines.model_path)
    prompt = tokenizer.encode(f"question {instance_id}?", add_special_tokens=False)
    response = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Sample(index=instance_id, prompt=f"uid-{instance_id}", tokens=prompt + response,
                  response_length=len(response), reward=reward, status=Sample.Status.COMPLETED,
                  loss_mask=[1] * len(response), metadata={"timestamp": "1"})


def test_finished_samples_built_outside_are_held_handed_back_and_trained_with_relayed_versions(cfg):
    buffer = create_data_buffer(cfg)
    relayed_text_versions.add(" seven is the answer", {3})
    relayed_text_versions.add(" four", {3})
    source = BufferDataSource(cfg, buffer, [], FLAG)
    assert source.get_buffer_length() == 0 and source.get_metadata() == {}
    groups = [[built_outside(cfg, "inst-a", " seven is the answer", 1.0), built_outside(cfg, "inst-a", " four", 0.0)]]
    kept = groups[0][0]
    source.add_samples(groups)
    assert kept.group_index is None and kept.index == "inst-a"  # the function's objects are left as they were
    assert source.get_buffer_length() == 1
    source.update_metadata({"0": ["inst-a"]})

    [handed] = source.get_samples(1)  # the held group first, not a prompt
    assert [s.index for s in handed] == ["inst-a", "inst-a"] and source.get_buffer_length() == 0
    assert [s.reward for s in handed] == [1.0, 0.0]
    trained = source.lean_group(handed, stopping=False)
    assert [s.group_index for s in trained] == [handed[0].group_index] * 2
    for s in trained:
        assert set(s.weight_versions) == {3} and s.status.value == "completed"
    buffer.put_finished_groups([trained])
    assert buffer.num_ready() == 1

    source.add_samples([[built_outside(cfg, "inst-b", " four", 1.0)]])
    [unused] = source.get_samples(1)
    buffer.put_partial_groups([source.lean_group(unused, stopping=True)])  # handed out, not trained: held again
    assert source.get_buffer_length() == 1 and buffer.num_pending() == 0

    later = BufferDataSource(cfg, buffer, [], FLAG)  # the next call of the function: the state outlived it
    assert later.get_metadata() == {"0": ["inst-a"]}
    [again] = later.get_samples(1)
    assert again[0].index == "inst-b" and again[0].response_length > 0
    [fresh] = later.get_samples(1)  # nothing held: a prompt group of the source
    assert fresh[0].prompt == "q0" and fresh[0].response_length == 0


def test_held_samples_whose_instance_id_is_another_samples_buffer_index_keep_their_versions(cfg):
    # rollout_buffer's instance ids are small integers, like the buffer's own indices: a sample is matched
    # to what it was when held by its tokens, not by an index that may name its group mate
    buffer = create_data_buffer(cfg)
    relayed_text_versions.add(" nine it is", {2})  # texts no other test relays
    relayed_text_versions.add(" five", {2})
    source = BufferDataSource(cfg, buffer, [], FLAG)
    source.add_samples([[built_outside(cfg, i, " nine it is", 1.0), built_outside(cfg, i, " five", 0.0)]
                        for i in range(3)])
    for handed in source.get_samples(3):
        trained = source.lean_group(handed, stopping=False)
        assert [set(s.weight_versions) for s in trained] == [{2}, {2}]
        assert [s.reward for s in trained] == [1.0, 0.0]


def test_held_groups_and_metadata_survive_a_checkpoint_even_when_handed_out(cfg):
    relayed_text_versions.add(" nine", {5})
    buffer = create_data_buffer(cfg)
    source = BufferDataSource(cfg, buffer, [], FLAG)
    source.add_samples([[built_outside(cfg, 7, " nine", 1.0)], [built_outside(cfg, 8, " nine", 0.5)]])
    source.update_metadata({"3": [7]})
    source.get_samples(1)  # one held group in flight at save time
    state = json.loads(json.dumps(buffer.state_dict()))

    restored = create_data_buffer(cfg)
    restored.load_state_dict(state)
    again = BufferDataSource(cfg, restored, [], FLAG)
    assert again.get_buffer_length() == 2 and again.get_metadata() == {"3": [7]}
    handed = again.get_samples(2)
    assert sorted(g[0].index for g in handed) == [7, 8]  # slime's index handed back as it was
    assert all(g[0].response_length > 0 and g[0].rollout_log_probs for g in handed)  # finished, not prompts


def test_a_sample_whose_text_no_relayed_answer_holds_is_refused_naming_the_flag(cfg):
    source = BufferDataSource(cfg, create_data_buffer(cfg), [], FLAG)
    with pytest.raises(ValueError, match=r"--rollout-function-path: .*policy version is unknown"):
        source.add_samples([[built_outside(cfg, 1, " never relayed zebra text", 1.0)]])


def test_a_span_written_by_two_policy_versions_is_refused(cfg):
    relayed_text_versions.add(" twice answered", {1})
    relayed_text_versions.add(" twice answered", {2})  # the same text, relayed from two versions
    source = BufferDataSource(cfg, create_data_buffer(cfg), [], FLAG)
    with pytest.raises(ValueError, match="policy version"):
        source.add_samples([[built_outside(cfg, 1, " twice answered", 1.0)]])


def test_tool_tokens_of_an_outside_sample_are_not_generated(cfg):
    relayed_text_versions.add(" call the tool", {4})
    sample = built_outside(cfg, 2, " call the tool", 1.0)
    sample.loss_mask = [1] * (sample.response_length - 1) + [0]  # its last token came from a tool
    source = BufferDataSource(cfg, create_data_buffer(cfg), [], FLAG)
    source.add_samples([[sample]])
    [[handed]] = source.get_samples(1)
    [trained] = source.lean_group([handed], stopping=False)
    assert trained.weight_versions[-1] == NOT_GENERATED and set(trained.weight_versions[:-1]) == {4}


def test_deepscaler_rule_based_reward_is_served_synchronously_outside_a_run():
    # rollout_buffer's generator scores in its own processes, where no lean_rl run is bound
    from slime.rollout.rm_hub import get_deepscaler_rule_based_reward

    assert get_deepscaler_rule_based_reward("think</think> so \\boxed{4}", "4") == 1
    assert get_deepscaler_rule_based_reward("think</think> \\boxed{5}", "\\boxed{4}") == 0
    assert get_deepscaler_rule_based_reward("no end of thought \\boxed{4}", "4") == 0
    assert get_deepscaler_rule_based_reward("think</think> \\boxed{4}", "") == 0


def test_a_message_list_prompt_without_the_chat_template_is_kept_for_a_users_generate_only(tiny_qwen2, tmp_path):
    # slime's data (dapo-math-17k) holds message lists; strands_sglang's example asks for no
    # --apply-chat-template and reads sample.prompt[0]["content"] itself
    from lean_rl.buffer.prompt_source import BadRowError

    data = tmp_path / "dapo.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}], "label": "4"}) + "\n")
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--output-dir", str(tmp_path / "o")]
    with pytest.raises(BadRowError, match="pass --apply-chat-template"):
        create_data_buffer(parse_config(base))  # lean_rl's own generate needs the prompt's tokens
    cfg = parse_config([*base, "--custom-generate-function-path", "examples.strands_sglang.generate_with_strands.generate"])
    [group] = create_data_buffer(cfg).get_prompt_groups(1)
    assert group[0].prompt == [{"role": "user", "content": "2+2?"}] and group[0].tokens == []
