"""docs/extending.md is tested, so its examples cannot drift from the API: the ```python blocks, as
written, become the user module `my_hooks`; each hook is loaded with the flags of its ```bash block
(the ones after `...`) through the run's own start-up checks (parse_config, then load_extensions),
then called on samples with a stand-in for the engines (no server starts)."""

import asyncio
import json
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from lean_rl.backends.sglang.responses import GenerateResult
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.config import parse_config
from lean_rl.rollout import default
from lean_rl.rollout.base import load_extensions
from lean_rl.sample import NOT_GENERATED, Sample, Status

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
HOOK_FLAGS = ("--rollout-function-path", "--custom-generate-function-path", "--custom-rm-path",
              "--dynamic-sampling-filter-path")
REPLY = " 12 30"  # what the stand-in engine generates, every time


def doc_blocks(lang: str) -> list[str]:
    return [code for block_lang, code in re.findall(r"^```(\w+)\n(.*?)^```$", DOC.read_text(), re.S | re.M)
            if block_lang == lang]


def doc_examples() -> dict[str, list[str]]:
    """Hook name in my_hooks -> the flags its bash block gives it."""
    examples = {}
    for code in doc_blocks("bash"):
        argv = shlex.split(code.replace("\\\n", " "))
        flags = argv[argv.index("...") + 1:]
        [name] = [value.removeprefix("my_hooks.") for flag, value in zip(flags, flags[1:])
                  if flag in HOOK_FLAGS and value.startswith("my_hooks.")]
        examples[name] = flags
    return examples


@pytest.fixture
def my_hooks():
    module = types.ModuleType("my_hooks")
    sys.modules["my_hooks"] = module
    try:
        for i, code in enumerate(doc_blocks("python"), 1):
            exec(compile(code, f"{DOC} (python block {i})", "exec"), module.__dict__)
        yield module
    finally:
        sys.modules.pop("my_hooks", None)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"add 12 and 30 ({i})", "label": "12 30"}) + "\n" for i in range(4)))
    return path


@pytest.fixture
def load(tiny_qwen2, prompts, my_hooks):
    """load(name) -> (cfg, extensions): the example's flags through the run's start-up checks."""
    def load(name: str, *extra: str):
        cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts),
                            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                            "--rollout-max-response-len", "64", *doc_examples()[name], *extra])
        return cfg, load_extensions(cfg)
    return load


@pytest.fixture
def engine(monkeypatch, tiny_qwen2):
    """Stands in for the router: every /generate answers REPLY (cut to max_new_tokens) at version 3."""
    requests = []
    reply_ids = load_tokenizer(str(tiny_qwen2)).encode(REPLY, add_special_tokens=False)

    async def generate_with_retries(cfg, input_ids, sampling_params, rid, on_retry=None):
        requests.append(dict(sampling_params))
        ids = reply_ids[:sampling_params["max_new_tokens"]]
        return GenerateResult(output_ids=ids, output_log_probs=[-0.5] * len(ids),
                              finish_reason="stop" if len(ids) == len(reply_ids) else "length", finish_detail=None,
                              weight_version="3", weight_version_spans=(), prompt_tokens=len(input_ids),
                              completion_tokens=len(ids), cached_tokens=0, rid=rid, text=None)

    monkeypatch.setattr(default, "generate_with_retries", generate_with_retries)
    return requests


def _sample(index: int, response: str, label: str = "4", status: Status = Status.COMPLETED) -> Sample:
    sample = Sample(index=index, group_index=0, prompt="p", tokens=[1, 2], label=label)
    n = len(response.split())
    sample.append_response(list(range(3, 3 + n)), text=response, log_probs=[-1.0] * n, weight_versions=0)
    sample.status = status
    return sample


def test_every_hook_flag_has_an_example():
    flags = {flag for example in doc_examples().values() for flag in example}
    assert set(HOOK_FLAGS) | {"--group-rm"} <= flags


@pytest.mark.parametrize("name", sorted(doc_examples()))
def test_example_passes_the_start_up_checks(load, my_hooks, name):
    _, ext = load(name)
    assert getattr(my_hooks, name) in (ext.rollout, ext.generate, ext.reward, ext.dynamic_filter)


def test_reward_example(load):
    cfg, ext = load("boxed_with_format_bonus")
    scores = [asyncio.run(ext.reward(cfg, _sample(0, text))) for text in
              ("so \\boxed{4}", "so \\boxed{5}", "4")]
    assert scores == [1.0, 0.1, 0.0]


def test_group_reward_example(load):
    cfg, ext = load("shortest_correct_wins")
    assert ext.group_reward
    group = [_sample(0, "4", "4"), _sample(1, "4 4", "4 4"), _sample(2, "5", "4"),
             _sample(3, "4", "4", Status.FAILED)]
    assert asyncio.run(ext.reward(cfg, group)) == [1.0, 0.5, 0.0, 0.0]


def test_filter_example(load):
    cfg, ext = load("varied_and_not_all_truncated")

    def group(rewards, status=Status.COMPLETED):
        samples = [_sample(i, "x", status=status) for i in range(len(rewards))]
        for sample, reward in zip(samples, rewards):
            sample.reward = reward
        return samples

    assert ext.dynamic_filter(cfg, group([0.0, 1.0]))
    assert not ext.dynamic_filter(cfg, group([1.0, 1.0]))
    assert not ext.dynamic_filter(cfg, group([0.0, 1.0], Status.TRUNCATED))


def test_multi_turn_generate_example(load, engine, tiny_qwen2):
    cfg, ext = load("calculator_generate")
    tokenizer = load_tokenizer(str(tiny_qwen2))
    [group] = create_data_buffer(cfg).get_prompt_groups(1)
    sample = asyncio.run(ext.generate(cfg, group[0], cfg.rollout.sampling.to_sglang()))
    sample.check()
    reply, tool = len(tokenizer.encode(REPLY, add_special_tokens=False)), sample.loss_mask.count(0)
    assert [r["max_new_tokens"] for r in engine] == [32, 64 - reply - tool]  # turn 1: half; turn 2: what is left
    assert sample.status is Status.COMPLETED and "[calculator] 42" in sample.response
    assert sample.loss_mask == [1] * reply + [0] * tool + [1] * reply
    assert sample.weight_versions == [3] * reply + [NOT_GENERATED] * tool + [3] * reply
    assert sample.rollout_log_probs[reply:reply + tool] == [0.0] * tool


def test_rollout_function_example(load, engine, prompts):
    cfg, ext = load("plain_rollout", "--eval-prompt-data", "toy", str(prompts))
    buffer = create_data_buffer(cfg)
    out = asyncio.run(ext.rollout(cfg, 0, buffer, False))
    groups = buffer.get_train_groups(10)
    assert len(groups) == 2 and buffer.num_in_flight() == 0
    assert all(s.reward == 1.0 and s.status is Status.COMPLETED for g in groups for s in g)  # --rm-type exact
    assert out.metrics["rollout/groups"] == 2.0 and out.metrics["rollout/reward_mean"] == 1.0
    evaluation = asyncio.run(ext.rollout(cfg, 0, None, True))
    assert evaluation.metrics["eval/toy/reward_mean"] == 1.0
