"""Reward models, judges and reward routing, their pure parts: the judge's built-in parsers, the
route table's errors, routing and per-route concurrency and metrics, the flags' checks (a reward
model of the wrong class), the engines' configs and a judge that cannot be reached. Real engines:
tests/integration/test_reward_engines.py."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.config import parse_config
from lean_rl.options import ConfigError, build
from lean_rl.rollout import judge as judge_module
from lean_rl.rollout.judge import JUDGE_ERROR, JudgeError, parse_a_or_b, parse_score_0_10, prepare_judge
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.rollout.reward_model import classify_body, read_score
from lean_rl.rollout.reward_routing import (ROUTE, RewardRouter, RouteSpec, RouteTable, last_code_block, parse_routes,
                                            route_metrics, route_of)
from lean_rl.rollout.reward_serving_config import REWARD_MODEL_CLASSES, RewardServingConfig
from lean_rl.rollout.rewards import score_group
from lean_rl.sample import Sample, Status
from lean_rl.utils.net import find_free_port


@pytest.mark.parametrize("text, expected", [
    ("Rating: 7", 0.7), ("I'd say 3 out of 10. Rating: 8", 0.8), ("rating=10", 1.0), ("It is a 4.5", 0.45),
    ("Rating: 11", None), ("no number here", None), ("", None), ("Rating: 0", 0.0),
])
def test_score_0_10_reads_the_rating_over_ten(text, expected):
    assert parse_score_0_10(text) == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("text, expected", [
    ("A", 1.0), ("B", 0.0), ("(A)", 1.0), ("Answer: B.", 0.0), ("A or B? The answer is A", 1.0),
    ("A or B? A", None),
    ("A and B", None), ("Absolutely", None), ("", None), ("Both are Bad", None),
])
def test_a_or_b_reads_one_letter(text, expected):
    assert parse_a_or_b(text) == expected


def _sample(index=0, metadata=None, response="r", label="4", prompt="p"):
    s = Sample(index=index, group_index=0, prompt=prompt, tokens=[5, 6], label=label, metadata=dict(metadata or {}))
    s.append_response([7, 8], log_probs=[-1.0, -1.0], weight_versions=0)
    s.response, s.status = response, Status.COMPLETED
    return s


@pytest.mark.parametrize("data, message", [
    ([], "expected a mapping with keys field, default, routes"),
    ({"field": "task", "routes": {"a": "exact"}, "extra": 1}, "unknown key 'extra'"),
    ({"routes": {"a": "exact"}}, "field: the metadata key"),
    ({"field": "task", "routes": {}}, "routes: a mapping of field values"),
    ({"field": "task", "routes": {"a": {"reward": "exact", "limit": 2}}}, "routes: a: expected {reward"),
    ({"field": "task", "routes": {"a": {"reward": "exact", "concurrency": 0}}}, "routes: a: concurrency must be"),
    ({"field": "task", "routes": {"a": "exact"}, "default": "b"}, "default: 'b' is not one of the routes (a)"),
])
def test_a_bad_route_table_is_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match="^routes.yaml: " + __import__("re").escape(message)):
        parse_routes(data, "routes.yaml")


def test_samples_take_the_route_their_row_names_else_the_default():
    table = parse_routes({"field": "task", "routes": {"math": "exact", "chat": {"reward": "f1", "concurrency": 2}},
                          "default": "chat"}, "r")
    assert table.routes == {"math": RouteSpec("exact", 8), "chat": RouteSpec("f1", 2)}
    assert route_of(table, _sample(metadata={"task": "math"})) == "math"
    assert route_of(table, _sample(metadata={"task": "poetry"})) == "chat"
    assert route_of(table, _sample()) == "chat"
    assert route_of(RouteTable("task", table.routes), _sample(metadata={"task": "poetry"})) is None


def test_the_router_scores_each_sample_by_its_route_within_each_routes_concurrency():
    in_flight = {"slow": 0, "fast": 0}
    peak = {"slow": 0, "fast": 0}

    def rewarder(name, value):
        async def reward(cfg, sample):
            in_flight[name] += 1
            peak[name] = max(peak[name], in_flight[name])
            await asyncio.sleep(0.01)
            in_flight[name] -= 1
            if sample.metadata.get("boom"):
                raise RuntimeError("checker crashed")
            return value
        return reward

    table = RouteTable("task", {"slow": RouteSpec("x", 2), "fast": RouteSpec("y", 5)})
    router = RewardRouter(table, {"slow": rewarder("slow", 1.0), "fast": rewarder("fast", 0.25)})
    samples = ([_sample(i, {"task": "slow"}) for i in range(6)] + [_sample(10 + i, {"task": "fast"}) for i in range(6)]
               + [_sample(20, {"task": "fast", "boom": True}), _sample(21, {"task": "none"})])
    cfg = SimpleNamespace(reward=SimpleNamespace(rm_timeout=5.0, reward_key=None), eval=SimpleNamespace(reward_key=None))
    counters = __import__("collections").Counter()
    asyncio.run(score_group(cfg, samples, router, False, counters))
    assert peak == {"slow": 2, "fast": 5}
    assert [s.reward for s in samples[:12]] == [1.0] * 6 + [0.25] * 6
    crashed, unrouted = samples[12], samples[13]
    assert crashed.status is Status.FAILED and "checker crashed" in crashed.metadata["reward_error"]
    assert unrouted.status is Status.FAILED and "has no route and there is no default" in unrouted.metadata["reward_error"]
    assert counters["reward_failed"] == 2
    metrics = rollout_metrics([samples])
    assert metrics["rollout/reward_route/slow/samples"] == 6 and metrics["rollout/reward_route/slow/failed"] == 0
    assert metrics["rollout/reward_route/fast/samples"] == 7 and metrics["rollout/reward_route/fast/failed"] == 1
    assert metrics["rollout/reward_route/fast/reward_mean"] == 0.25
    assert metrics["rollout/reward_route/slow/seconds"] > 0
    assert ROUTE not in unrouted.metadata and "rollout/reward_route/none/samples" not in metrics


def test_route_metrics_count_the_judges_failures():
    failed = _sample(0)
    failed.status, failed.metadata[JUDGE_ERROR] = Status.FAILED, "nothing parseable"
    assert route_metrics([failed, _sample(1)]) == {"rollout/judge_failed": 1.0}


def test_the_code_checker_runs_the_last_code_block():
    assert last_code_block("try:\n```python\nx = 1\n```\nbetter:\n```python\nx = 2\n```") == "x = 2\n"
    assert last_code_block("print(3)") == "print(3)"


def _checkpoint(tmp_path, name, architectures):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": architectures}))
    return str(path)


def test_a_reward_model_of_the_wrong_class_is_one_line_naming_the_file_and_the_classes(tmp_path):
    causal = _checkpoint(tmp_path, "causal", ["Qwen2ForCausalLM"])
    with pytest.raises(ConfigError) as err:
        build(RewardServingConfig, rm_hf_checkpoint=causal)
    message = str(err.value)
    assert "\n" not in message and f"{causal}/config.json names architectures ['Qwen2ForCausalLM']" in message
    assert all(name in message for name in REWARD_MODEL_CLASSES)
    with pytest.raises(ConfigError, match=f"--rm-hf-checkpoint {tmp_path}: cannot read {tmp_path}/config.json"):
        build(RewardServingConfig, rm_hf_checkpoint=str(tmp_path))
    served = build(RewardServingConfig, rm_hf_checkpoint=_checkpoint(tmp_path, "rm", ["LlamaForSequenceClassification"]))
    assert served.rm_num_engines == 1 and served.engine_count == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(rm_num_engines=2), "--rm-num-engines sizes the reward model this run serves"),
    (dict(judge_url="http://x:1", judge_hf_checkpoint="/j"), "either --judge-hf-checkpoint"),
    (dict(judge_num_engines=1), "--judge-num-engines sizes the judge this run serves"),
    (dict(judge_hf_checkpoint="/no/such"), "--judge-hf-checkpoint /no/such: not an HF checkpoint"),
    (dict(judge_url="x:1"), "--judge-url 'x:1': give http://HOST:PORT"),
    (dict(judge_url="http://x:1", judge_template="my.template"), "--judge-template my.template: a template of yours"),
    (dict(judge_url="http://x:1", judge_temperature=-1.0), "--judge-temperature must be >= 0"),
])
def test_judge_and_reward_model_flags_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        build(RewardServingConfig, **kwargs)


def test_served_engines_take_the_policys_settings_on_ports_of_their_own(tmp_path):
    policy = resolve_api_key(resolve_ports(build(EngineConfig, model_path="/policy", num_engines=2, device="cpu",
                                                 other_cpu_engines=3, server_passthrough=("--chunked-prefill-size", "64"))))
    serving = build(RewardServingConfig, rm_hf_checkpoint=_checkpoint(tmp_path, "rm", ["Qwen2ForSequenceClassification"]),
                    judge_hf_checkpoint=_checkpoint(tmp_path, "judge", ["Qwen2ForCausalLM"]), judge_num_engines=2)
    served = serving.with_engines(policy, taken={12345}, other_cpu_engines=0)
    rm, judge = served.rm_engines, served.judge_engines
    assert rm.server_passthrough == ("--chunked-prefill-size", "64", "--is-embedding")
    assert judge.server_passthrough == ("--chunked-prefill-size", "64") and judge.num_engines == 2
    assert rm.api_key == judge.api_key == policy.api_key and rm.adapter is None
    assert (rm.other_cpu_engines, judge.other_cpu_engines) == (2, 1)  # the other served groups' servers
    ports = [{*c.engine_ports, c.resolved_router_port} for c in (policy, rm, judge)]
    assert not (ports[0] & ports[1] or ports[0] & ports[2] or ports[1] & ports[2]) and 12345 not in ports[1] | ports[2]


def _prompt_file(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "2+2?", "label": "4"}\n')
    return str(data)


def test_the_run_says_how_a_reward_model_and_a_judge_combine(tiny_qwen2, tmp_path):
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", _prompt_file(tmp_path)]
    rm = _checkpoint(tmp_path, "rm", ["LlamaForSequenceClassification"])
    with pytest.raises(ConfigError, match="--rm-hf-checkpoint and a judge"):
        parse_config(base + ["--rm-hf-checkpoint", rm, "--judge-url", "http://127.0.0.1:1"])
    routes = tmp_path / "routes.yaml"
    routes.write_text("field: task\nroutes: {math: exact}\n")
    with pytest.raises(ConfigError, match="--reward-routes .* picks each sample's reward: drop --rm-type"):
        parse_config(base + ["--reward-routes", str(routes), "--rm-type", "exact"])
    cfg = parse_config(base + ["--rm-hf-checkpoint", rm, "--judge-url", "http://127.0.0.1:1", "--reward-routes", str(routes)])
    assert cfg.reward_serving.rm_engines.model_path == rm and cfg.reward_serving.judge_engines is None
    assert cfg.engines.other_cpu_engines == 1  # the reward model's server shares the cores


def test_a_route_to_a_rewarder_the_run_lacks_is_refused_at_start_up(tiny_qwen2, tmp_path):
    from lean_rl.extensions import load_extensions

    routes = tmp_path / "routes.yaml"
    routes.write_text("field: task\nroutes: {chat: reward_model}\n")
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", _prompt_file(tmp_path),
                        "--reward-routes", str(routes)])
    with pytest.raises(ConfigError, match=f"--reward-routes {routes}: routes: chat: reward_model needs --rm-hf-checkpoint"):
        load_extensions(cfg)
    routes.write_text("field: task\nroutes: {chat: nothing}\n")
    with pytest.raises(ConfigError, match="routes: chat: 'nothing' is no rewarder"):
        load_extensions(cfg)


def test_the_reward_model_is_sent_token_ids_or_text_and_its_score_is_label_0():
    sample = _sample(response=" four", prompt="2+2?")
    assert classify_body(sample, same_tokenizer=True) == {"input_ids": [5, 6, 7, 8]}
    assert classify_body(sample, same_tokenizer=False) == {"text": "2+2? four"}
    with pytest.raises(ValueError, match="render it"):
        classify_body(_sample(prompt=[{"role": "user", "content": "hi"}]), same_tokenizer=False)
    assert read_score({"embedding": [0.5, -1.0], "meta_info": {}}) == 0.5
    for bad in ({"embedding": []}, {"text": "x"}, [0.5], {"embedding": [float("nan")]}):
        with pytest.raises(ValueError):
            read_score(bad)


def test_a_judge_that_cannot_be_reached_fails_the_sample_and_gives_no_reward():
    port = find_free_port("127.0.0.1")  # nothing listens there: a real connection failure
    serving = build(RewardServingConfig, judge_url=f"http://127.0.0.1:{port}", judge_retries=1, judge_timeout=30.0)
    cfg = SimpleNamespace(reward_serving=serving, reward=SimpleNamespace(rm_timeout=30.0, reward_key=None),
                          eval=SimpleNamespace(reward_key=None))
    judge_module._prepared.clear()
    judge = prepare_judge(cfg)
    samples = [_sample(0), _sample(1)]
    counters = __import__("collections").Counter()
    asyncio.run(score_group(cfg, samples, judge, False, counters))
    assert counters["reward_failed"] == 2
    for s in samples:
        assert s.status is Status.FAILED and s.reward == 0.0
        assert "2 tries, the last answered EngineConnectionError" in s.metadata[JUDGE_ERROR]
        assert s.metadata["reward_error"].startswith("JudgeError")
    assert rollout_metrics([samples])["rollout/judge_failed"] == 2
    with pytest.raises(JudgeError, match="--judge-timeout 0.001 s"):
        slow = build(RewardServingConfig, judge_url=f"http://127.0.0.1:{port}", judge_timeout=0.001)
        asyncio.run(judge(SimpleNamespace(reward_serving=slow), _sample(2)))
