"""Rewarders on real SGLang engines: an LLM judge served by engines (the session's `engine_group`
plays the judge's group: the tiny Qwen2 behind sglang-router, with the run's API key), its answers
read by the user's parsers, a parser that reads nothing failing the samples; and (slow) a reward
model served by its own engines with --is-embedding, its /classify scores equal to transformers'
for the same tokens, and a reward-routed rollout that uses it."""

import asyncio
import collections
import dataclasses
import json

import pytest

from lean_rl.config import parse_config
from lean_rl.rollout import judge as judge_module
from lean_rl.rollout.judge import JUDGE_ERROR, prepare_judge
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.rollout.rewards import score_group
from lean_rl.sample import Sample, Status

pytestmark = pytest.mark.integration

ANSWERS: list[str] = []  # what the judge answered, as the parser saw it


def words_parser(text: str) -> float:
    """A parser that reads any answer: the fraction of --judge-max-new-tokens it used, at most 1."""
    ANSWERS.append(text)
    return min(len(text.split()) / 8, 1.0)


def refusing_parser(text: str) -> None:
    ANSWERS.append(text)
    return None


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "the cat sat", "label": "mat", "metadata": {"task": "chat"}}) + "\n")
    return str(path)


def _sample(index: int, prompt: str, response: str, tokens: list[int]) -> Sample:
    s = Sample(index=index, group_index=0, prompt=prompt, tokens=list(tokens[:-2]), label="mat")
    s.append_response(tokens[-2:], log_probs=[-1.0, -1.0], weight_versions=0)
    s.response, s.status = response, Status.COMPLETED
    return s


def _judge_cfg(engine_group, tmp_path, parser: str):
    cfg = parse_config(["--hf-checkpoint", engine_group.config.model_path, "--prompt-data", _prompts(tmp_path),
                        "--judge-hf-checkpoint", engine_group.config.model_path, "--judge-template", "score_0_10",
                        "--judge-parser", parser, "--judge-max-new-tokens", "8", "--judge-retries", "1"])
    # the session's group stands in for the judge's: same model, router and key as the run would start
    return dataclasses.replace(cfg, reward_serving=dataclasses.replace(cfg.reward_serving,
                                                                       judge_engines=engine_group.config))


def test_a_served_judge_scores_samples_and_one_that_answers_nothing_parseable_fails_them(engine_group, tmp_path):
    samples = [_sample(i, "the cat sat on the", " mat", [5, 6, 7, 8 + i]) for i in range(3)]
    ANSWERS.clear()
    judge_module._prepared.clear()
    cfg = _judge_cfg(engine_group, tmp_path, f"{__name__}.words_parser")
    counters: collections.Counter = collections.Counter()
    asyncio.run(score_group(cfg, samples, prepare_judge(cfg), False, counters))
    assert not counters and len(ANSWERS) == 3 and all(ANSWERS)  # one answer per sample, none empty
    assert sorted(s.reward for s in samples) == sorted(min(len(a.split()) / 8, 1.0) for a in ANSWERS)
    assert all(s.status is Status.COMPLETED and 0 < s.reward <= 1 for s in samples)

    ANSWERS.clear()
    cfg = _judge_cfg(engine_group, tmp_path, f"{__name__}.refusing_parser")
    refused = [_sample(i, "the dog ran", " fast", [9, 10, 11, 12]) for i in range(2)]
    asyncio.run(score_group(cfg, refused, prepare_judge(cfg), False, counters))
    assert len(ANSWERS) == 4  # 2 samples x (1 try + --judge-retries 1)
    assert counters["reward_failed"] == 2
    for s in refused:
        assert s.status is Status.FAILED and s.reward == 0.0
        assert "nothing parseable by --judge-parser" in s.metadata[JUDGE_ERROR]
    assert rollout_metrics([refused])["rollout/judge_failed"] == 2


@pytest.mark.slow
def test_a_served_reward_model_scores_as_transformers_does_and_routes_score_by_row(tiny_qwen2, tmp_path, ray_cluster):
    import torch
    from transformers import AutoModelForSequenceClassification

    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.rollout.reward_model import reward_model_engine_group
    from lean_rl.rollout.reward_routing import RewardRouter
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.testing.tiny_reward_model import make_tiny_reward_model

    rm_dir = make_tiny_reward_model(tmp_path / "rm", tiny_qwen2)
    routes = tmp_path / "routes.yaml"
    routes.write_text("field: task\nroutes:\n  chat: {reward: reward_model, concurrency: 2}\n  math: exact\n")
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", _prompts(tmp_path),
                        "--rm-hf-checkpoint", str(rm_dir), "--reward-routes", str(routes)])
    # the test's engine settings (float32, small KV cache), with the reward model's own ports and --is-embedding
    policy = engine_config_for_tests(tiny_qwen2, "--rollout-num-engines", "1")
    cfg = dataclasses.replace(cfg, engines=policy, reward_serving=cfg.reward_serving.with_engines(policy, set(), 0))
    group = reward_model_engine_group(cfg, tmp_path)
    assert isinstance(group, EngineGroup)
    with group:
        token_lists = [[5, 6, 7, 8], [40, 41, 42, 43, 44], [100, 7, 30, 2]]
        samples = [_sample(i, "p", "r", tokens) for i, tokens in enumerate(token_lists)]
        for s in samples:
            s.metadata["task"] = "chat"
        exact = _sample(9, "p", "mat", [5, 6, 7, 8])
        exact.metadata["task"] = "math"
        counters: collections.Counter = collections.Counter()
        asyncio.run(score_group(cfg, samples + [exact], RewardRouter.from_config(cfg), False, counters))
    assert not counters
    model = AutoModelForSequenceClassification.from_pretrained(str(rm_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = [float(model(torch.tensor([tokens])).logits[0, 0]) for tokens in token_lists]
    assert [s.reward for s in samples] == pytest.approx(expected, abs=1e-3)
    assert len({round(r, 3) for r in expected}) == 3  # the head tells the texts apart
    assert exact.reward == 1.0
    metrics = rollout_metrics([samples + [exact]])
    assert metrics["rollout/reward_route/chat/samples"] == 3 and metrics["rollout/reward_route/math/samples"] == 1
    assert metrics["rollout/reward_route/chat/reward_mean"] == pytest.approx(sum(expected) / 3, abs=1e-3)
