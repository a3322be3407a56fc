"""docs/extending.md is tested, so its examples cannot drift from the API: the ```python blocks, as
written, become the user module `my_hooks`; each hook is loaded with the flags of its ```bash block
(the ones after `...`; the page's ```yaml block is the file my_config.yaml) through the run's own
start-up checks (parse_config, then load_extensions, installed as a run does), then called on samples with a stand-in for the
engines (no server starts)."""

import asyncio
import collections
import json
import re
import shlex
import sys
import types
from pathlib import Path

import pytest
import torch

from lean_rl.algorithms.hooks import AdvantageInputs, compute_custom_or_builtin_advantages, loss_function
from lean_rl.algorithms.losses import policy_loss
from lean_rl.backends.sglang.responses import GenerateResult
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.config import parse_config
from lean_rl.extensions import install
from lean_rl.rollout import default
from lean_rl.rollout import generate as generate_module
from lean_rl.rollout.base import call_rollout_function
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.rollout.reward_scoring import score_group
from lean_rl.train_hooks import before_training
from lean_rl.sample import NOT_GENERATED, Sample, Status

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
HOOK_FLAGS = ("--rollout-function-path", "--custom-generate-function-path", "--custom-rm-path",
              "--dynamic-sampling-filter-path", "--eval-function-path", "--data-source-path",
              "--rollout-sample-filter-path", "--rollout-all-samples-process-path",
              "--custom-reward-post-process-path", "--custom-advantage-function-path", "--custom-loss-function-path")
EXT_FIELDS = ("rollout", "generate", "reward", "dynamic_filter", "eval_rollout", "data_source", "sample_filter",
              "all_samples_process", "reward_post_process", "custom_advantage", "custom_loss")
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
def load(tiny_qwen2, prompts, my_hooks, tmp_path):
    """load(name) -> (cfg, extensions): the example's flags through the run's start-up checks. The
    files the examples name: my_config.yaml is the page's yaml block, toy_eval.jsonl the test prompts."""
    (tmp_path / "my_config.yaml").write_text("".join(doc_blocks("yaml")))
    files = {"my_config.yaml": str(tmp_path / "my_config.yaml"), "toy_eval.jsonl": str(prompts)}

    def load(name: str, *extra: str):
        flags = [files.get(flag, flag) for flag in doc_examples()[name]]
        data = [] if "--data-source-path" in flags else ["--prompt-data", str(prompts)]
        cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), *data,
                            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                            "--rollout-max-response-len", "64", "--output-dir", str(tmp_path / "run"),
                            *flags, *extra])
        return cfg, install(cfg)
    return load


@pytest.fixture
def engine(monkeypatch, tiny_qwen2):
    """Stands in for the router: every /generate answers REPLY (cut to max_new_tokens) at version 3."""
    requests = []
    reply_ids = load_tokenizer(str(tiny_qwen2)).encode(REPLY, add_special_tokens=False)

    async def generate_with_retries(cfg, input_ids, sampling_params, rid, on_retry=None, routing_key=None):
        requests.append(dict(sampling_params))
        ids = reply_ids[:sampling_params["max_new_tokens"]]
        return GenerateResult(output_ids=ids, output_log_probs=[-0.5] * len(ids),
                              finish_reason="stop" if len(ids) == len(reply_ids) else "length", finish_detail=None,
                              weight_version="3", weight_version_spans=(), prompt_tokens=len(getattr(input_ids, "input_ids", input_ids)),
                              completion_tokens=len(ids), cached_tokens=0, rid=rid, text=None)

    monkeypatch.setattr(generate_module, "generate_with_retries", generate_with_retries)
    return requests


def _sample(index: int, response: str, label: str = "4", status: Status = Status.COMPLETED) -> Sample:
    sample = Sample(index=index, group_index=0, prompt="p", tokens=[1, 2], label=label)
    n = len(response.split())
    sample.append_response(list(range(3, 3 + n)), text=response, log_probs=[-1.0] * n, weight_versions=0)
    sample.status = status
    return sample


def test_every_hook_flag_has_an_example():
    flags = {flag for example in doc_examples().values() for flag in example}
    assert set(HOOK_FLAGS) | {"--group-rm", "--reward-key", "--eval-reward-key", "--custom-config-path"} <= flags


@pytest.mark.parametrize("name", sorted(doc_examples()))
def test_example_passes_the_start_up_checks(load, my_hooks, name):
    _, ext = load(name)
    assert getattr(my_hooks, name) in [getattr(ext, field) for field in EXT_FIELDS]


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


def _score(cfg, ext, samples, evaluation=False):
    asyncio.run(score_group(cfg, samples, ext.reward, ext.group_reward, collections.Counter(), evaluation=evaluation))
    return samples


def test_dict_reward_example(load):
    cfg, ext = load("graded")
    right, boxed_wrong = _score(cfg, ext, [_sample(0, "so \\boxed{4}"), _sample(1, "so \\boxed{5}")])
    assert (right.reward, boxed_wrong.reward) == (1.0, pytest.approx(0.1))  # --reward-key score
    assert boxed_wrong.metadata["rewards"] == {"score": pytest.approx(0.1), "correct": 0.0, "boxed": 1.0}
    [evaluated] = _score(cfg, ext, [_sample(2, "so \\boxed{5}")], evaluation=True)
    assert evaluated.reward == 0.0  # --eval-reward-key correct
    metrics = rollout_metrics([[right, boxed_wrong]])
    assert metrics["rollout/reward/boxed_mean"] == 1.0 and metrics["rollout/reward/correct_mean"] == 0.5


def test_fan_out_generate_example(load, engine, tiny_qwen2):
    cfg, ext = load("calculator_per_turn")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(ext.rollout(cfg, 0, buffer, False))
    groups = buffer.get_train_groups(10)
    assert [len(g) for g in groups] == [4, 4] and out.metrics["rollout/fanout_samples"] == 4.0
    first, second = groups[0][:2]
    assert first.group_index == second.group_index and second.prompt_length > first.prompt_length
    assert second.tokens[:len(first.tokens)] == first.tokens and "[calculator] 42" not in second.response
    assert all(s.reward == 1.0 for g in groups for s in g)  # set by the generate function, kept
    [group] = create_data_buffer(cfg).get_prompt_groups(1)
    final = asyncio.run(ext.generate_call(cfg, group[0], cfg.eval.sampling.to_sglang(), True))
    assert isinstance(final, Sample) and final.reward == 1.0  # evaluation: the final turn only


def test_eval_function_example(load, engine):
    cfg, ext = load("eval_with_truncation", "--eval-interval", "1")
    out = asyncio.run(call_rollout_function(cfg, ext.evaluation_rollout, 0, None, True))
    assert out.metrics["eval/toy/truncated_frac"] == 0.0 and out.metrics["eval/toy/reward_mean"] == 1.0
    assert ext.evaluation_rollout is not ext.rollout


def test_data_source_example(load):
    cfg, _ = load("additions")
    buffer = create_data_buffer(cfg)
    groups = buffer.get_prompt_groups(3)
    assert all(int(g[0].label) == sum(g[0].metadata["operands"]) for g in groups)
    state = json.loads(json.dumps(buffer.state_dict()))
    resumed = create_data_buffer(cfg)
    resumed.load_state_dict(state)
    assert [g[0].prompt for g in resumed.get_prompt_groups(5)][:3] == [g[0].prompt for g in groups]


def test_all_samples_process_example(load, engine, tmp_path):
    cfg, _ = load("save_all_groups", "--num-epochs", "1")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(default.generate_rollout(cfg, 3, buffer))
    assert out.metrics["rollout/groups_filtered"] == 4.0  # every reward is 1: reward_varies drops them all
    lines = (tmp_path / "run" / "all_samples" / "rollout_3.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(len(json.loads(line)) == 2 for line in lines)


def test_sample_filter_example(load):
    cfg, ext = load("skip_truncated")
    group = [_sample(0, "4"), _sample(1, "4 4", status=Status.TRUNCATED)]
    assert before_training(cfg, ext, [group]) == {"train/samples_rejected": 1.0}
    assert group[0].loss_mask == [1] and group[1].loss_mask == [0, 0]


def test_reward_post_process_and_custom_config_example(load):
    cfg, ext = load("length_penalty")
    assert cfg.custom["length_penalty"] == 0.01
    group = [_sample(0, "4"), _sample(1, "4 4 4")]
    group[0].reward = group[1].reward = 1.0
    before_training(cfg, ext, [group])
    assert [s.reward for s in group] == [1.0, pytest.approx(0.98)] and group[1].metadata["raw_reward"] == 1.0


def test_custom_advantage_example(load):
    cfg, ext = load("clipped_advantages", "--advantage-estimator", "dr_grpo")
    mask = torch.ones(4, 2)
    inputs = AdvantageInputs(rewards=torch.tensor([0.0, 0.0, 0.0, 10.0]), group_ids=torch.zeros(4, dtype=torch.long),
                             mask=mask, valid=torch.ones(4, dtype=torch.bool), rollout_log_probs=torch.zeros(4, 2))
    advantages, returns = compute_custom_or_builtin_advantages(cfg.algorithm, inputs)
    assert advantages[:, 0].tolist() == [-2.0, -2.0, -2.0, 2.0] and returns is None  # -2.5 and 7.5, clipped


def test_custom_loss_example(load):
    cfg, ext = load("reinforce_loss")
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    inputs = dict(advantages=torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]]), mask=mask, weights=mask / 3,
                  metric_weights=mask / 3, old_log_probs=None, ref_log_probs=None, rollout_log_probs=None, entropy=None)
    grads = []
    for fn in (loss_function(cfg.algorithm), policy_loss):
        log_probs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
        loss, metrics = fn(cfg.algorithm, log_probs=log_probs, **inputs)
        loss.backward()
        grads.append(log_probs.grad)
    assert torch.allclose(grads[0], grads[1])  # the PPO loss's gradient at ratio 1
    assert ext.custom_loss.__name__ == "reinforce_loss"
