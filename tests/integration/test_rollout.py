"""The rollout side against the real engines: 2 CPU SGLang servers behind sglang-router (the shared
`engine_group`), the default rollout function, custom generate/reward functions, engine death."""

import asyncio
import collections
import dataclasses
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lean_rl.extensions import install as install_hooks
from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.health import EngineMonitor
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.config import parse_config
from lean_rl.rollout.default import generate, generate_rollout
from lean_rl.rollout.evaluation import EvaluationFailedError
from lean_rl.sample import NOT_GENERATED, Status

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WORDS = "the cat dog sat on mat ran fast big small red blue green hello world".split()


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rollout_data") / "prompts.jsonl"
    rows = [{"prompt": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4)), "label": WORDS[i % len(WORDS)]}
            for i in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def user_plugins(tmp_path_factory):
    """A user package with a custom generate, a raising reward and a counting reward."""
    root = tmp_path_factory.mktemp("plugins")
    (root / "rollout_plugins.py").write_text(textwrap.dedent("""
        from lean_rl.rollout.default import generate as default_generate
        from lean_rl.buffer.prompt_source import load_tokenizer

        async def two_turn_generate(cfg, sample, sampling_params):
            # turn 1 by the policy, then a tool observation (not trained on), then turn 2
            params = dict(sampling_params, max_new_tokens=6)
            sample = await default_generate(cfg, sample, params)
            tool_ids = load_tokenizer(cfg.engines.model_path).encode(" tool says hello", add_special_tokens=False)
            sample.append_response(tool_ids, trainable=False)
            params["max_new_tokens"] = sample.response_length + 6
            return await default_generate(cfg, sample, params)

        async def raising_rm(cfg, sample):
            if sample.index % 2:
                raise RuntimeError("reward service exploded")
            return 1.0

        async def length_rm(cfg, sample):
            return float(sample.response_length % 2)

        async def token_checksum_rm(cfg, sample):  # tells responses apart by their tokens
            return float(sum((i + 1) * t for i, t in enumerate(sample.response_tokens)))

        async def sometimes_bad_request_generate(cfg, sample, sampling_params, evaluation=False):
            # every third prompt asks the engine for something it refuses (a real HTTP 400)
            if sample.group_index % 3 == 0:
                sampling_params = dict(sampling_params, temperature=-1.0)
            return await default_generate(cfg, sample, sampling_params)
    """))
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))


def make_cfg(engine_group, prompts_file, *flags):
    cfg = parse_config(["--hf-checkpoint", engine_group.config.model_path, "--prompt-data", str(prompts_file),
                        "--rollout-batch-size", "16", "--n-samples-per-prompt", "4",
                        "--rollout-max-response-len", "24", *flags])
    cfg = dataclasses.replace(cfg, engines=engine_group.config)
    install_hooks(cfg)  # what a run does at start-up
    return cfg


def ready_samples(buffer):
    return [s for g in buffer.get_train_groups(1000) for s in g]


def test_16_prompts_x_4_samples_with_log_probs_and_versions(engine_group, prompts_file):
    cfg = make_cfg(engine_group, prompts_file, "--rm-type", "exact")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(generate_rollout(cfg, 0, buffer))
    samples = ready_samples(buffer)
    tokenizer = load_tokenizer(engine_group.config.model_path)
    assert out.metrics["rollout/groups"] == 16 and len(samples) == 64
    assert len({s.index for s in samples}) == 64 and len({s.group_index for s in samples}) == 16
    for s in samples:
        s.check()
        assert 1 <= s.response_length <= 24 and s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert all(lp <= 0 for lp in s.rollout_log_probs) and s.weight_versions == [0] * s.response_length
        assert s.reward in (0.0, 1.0)
        # the engine's text, which generate takes as the response, is exactly the tokenizer's decode
        assert s.response == tokenizer.decode(s.response_tokens)
    assert any(s.status is Status.TRUNCATED for s in samples)
    assert buffer.num_in_flight() == 0


def test_a_response_ended_by_a_stop_token_is_the_engine_text_and_equals_decode(engine_group, prompts_file):
    cfg = make_cfg(engine_group, prompts_file, "--rm-type", "exact", "--rollout-batch-size", "4")
    buffer = create_data_buffer(cfg)
    asyncio.run(generate_rollout(cfg, 0, buffer))
    common = collections.Counter(t for s in ready_samples(buffer) for t in s.response_tokens).most_common(3)
    cfg = make_cfg(engine_group, prompts_file, "--rm-type", "exact", "--rollout-batch-size", "4",
                   "--rollout-stop-token-ids", *(str(token) for token, _ in common))
    buffer = create_data_buffer(cfg)
    asyncio.run(generate_rollout(cfg, 0, buffer))
    samples = ready_samples(buffer)
    assert any(s.status is Status.COMPLETED for s in samples), "no sample met a stop token: the test shows nothing"
    tokenizer = load_tokenizer(engine_group.config.model_path)
    for s in samples:
        assert s.response == tokenizer.decode(s.response_tokens)


def test_a_response_stopped_by_a_stop_string_keeps_it_as_decode_does(engine_group, prompts_file):
    # SGLang's text would end inside the token that holds the stop string: generate decodes itself then
    cfg = make_cfg(engine_group, prompts_file, "--rm-type", "exact", "--rollout-batch-size", "4",
                   "--rollout-stop", "as", "was", " yes", "odel")
    buffer = create_data_buffer(cfg)
    asyncio.run(generate_rollout(cfg, 0, buffer))
    samples = ready_samples(buffer)
    stopped = [s for s in samples if s.status is Status.COMPLETED]
    assert stopped, "no sample met a stop string: the test shows nothing"
    tokenizer = load_tokenizer(engine_group.config.model_path)
    for s in samples:
        assert s.response == tokenizer.decode(s.response_tokens)


def test_custom_generate_masks_tool_tokens(engine_group, prompts_file, user_plugins):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                   "--custom-generate-function-path", "rollout_plugins.two_turn_generate", "--rm-type", "f1")
    buffer = create_data_buffer(cfg)
    asyncio.run(generate_rollout(cfg, 0, buffer))
    samples = ready_samples(buffer)
    assert len(samples) == 4
    for s in samples:
        tool = [i for i, m in enumerate(s.loss_mask) if m == 0]
        assert tool, "the tool observation must be masked out"
        assert all(s.weight_versions[i] == NOT_GENERATED and s.rollout_log_probs[i] == 0.0 for i in tool)
        assert " tool says hello" in s.response
        assert s.loss_mask[0] == 1  # turn 1 is trained on


def test_raising_reward_marks_failed_and_the_rollout_goes_on(engine_group, prompts_file, user_plugins):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-batch-size", "4", "--custom-rm-path", "rollout_plugins.raising_rm")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(generate_rollout(cfg, 0, buffer))
    samples = ready_samples(buffer)
    failed = [s for s in samples if s.status is Status.FAILED]
    assert len(samples) == 16 and len(failed) == 8 and out.metrics["rollout/reward_failed"] == 8
    assert all(s.reward == 0.0 and "exploded" in s.metadata["reward_error"] for s in failed)
    assert all(s.reward == 1.0 for s in samples if s.status is not Status.FAILED)


def test_over_sampling_with_filter_returns_the_surplus_to_the_buffer(engine_group, prompts_file, user_plugins):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-batch-size", "3", "--over-sampling-batch-size", "8",
                   "--custom-rm-path", "rollout_plugins.length_rm",
                   "--dynamic-sampling-filter-path", "lean_rl.rollout.filters.reward_varies")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(generate_rollout(cfg, 0, buffer))
    kept = buffer.get_train_groups(100)
    assert len(kept) == 3 and all(len({s.reward for s in g}) > 1 for g in kept)
    counters = buffer.get_counters()
    # every group handed out is accounted for: kept, filtered or back in the buffer (none in flight)
    handed_out = counters["prompts_issued"]
    assert buffer.num_in_flight() == 0
    assert 3 + counters.get("groups_dropped_filtered", 0) + buffer.num_pending() == handed_out
    assert out.metrics["rollout/groups"] == 3


def test_remax_rollout_records_the_greedy_baseline_reward_on_every_sample(engine_group, prompts_file, user_plugins):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-batch-size", "2", "--n-samples-per-prompt", "3",
                   "--rollout-max-response-len", "8", "--advantage-estimator", "remax",
                   "--custom-rm-path", "rollout_plugins.token_checksum_rm")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(asyncio.wait_for(generate_rollout(cfg, 0, buffer), 120))
    groups = buffer.get_train_groups(100)
    assert len(groups) == 2 and all(len(g) == 3 for g in groups)  # the greedy response is not in the batch
    assert buffer.get_counters()["prompts_issued"] == 2 and buffer.num_in_flight() == 0
    baselines = [g[0].metadata["remax_baseline_reward"] for g in groups]
    assert all(s.metadata["remax_baseline_reward"] == b for g, b in zip(groups, baselines) for s in g)
    assert out.metrics["rollout/remax_baseline_reward_mean"] == pytest.approx(sum(baselines) / 2)
    # the baseline is the greedy response: the same tokens as a temperature-0 request of the prompt, on either engine
    greedy_params = {**cfg.rollout.sampling.to_sglang(), "temperature": 0.0}
    for url in engine_group.engine_urls:
        with BlockingEngineClient(url, api_key=engine_group.config.api_key) as client:
            for g, baseline in zip(groups, baselines):
                ids = client.generate(g[0].tokens[:g[0].prompt_length], greedy_params).output_ids
                assert ids and baseline == float(sum((i + 1) * t for i, t in enumerate(ids)))


def test_partial_rollout_resumes_and_keeps_per_token_versions(engine_group, prompts_file):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                   "--rollout-max-response-len", "1500", "--rollout-ignore-eos", "--partial-rollout", "--rm-type", "exact")
    buffer = create_data_buffer(cfg)
    groups = buffer.get_prompt_groups(2)
    clients = [BlockingEngineClient(url, api_key=engine_group.config.api_key) for url in engine_group.engine_urls]

    async def generate_then_abort():
        params = cfg.rollout.sampling.to_sglang()
        tasks = [asyncio.create_task(generate(cfg, s, dict(params))) for g in groups for s in g]
        await asyncio.sleep(1.0)  # 1500 tokens take several seconds: the abort lands mid-generation
        for c in clients:
            c.abort_request(abort_all=True)
        await asyncio.gather(*tasks)

    try:
        asyncio.run(asyncio.wait_for(generate_then_abort(), 120))
        aborted = {s.index: s.response_length for g in groups for s in g if s.status is Status.ABORTED}
        assert aborted and all(n > 0 for n in aborted.values()), "the abort should catch samples mid-generation"
        for g in groups:  # what the rollout does with interrupted groups under --partial-rollout
            for s in g:
                s.status = Status.PENDING if s.status is Status.ABORTED else s.status
        buffer.put_partial_groups(groups)
        for c in clients:  # a weight update: the policy is now version 1
            c.update_weights_from_disk(engine_group.config.model_path, weight_version="1")
        asyncio.run(asyncio.wait_for(generate_rollout(cfg, 1, buffer), 300))
        finished = {s.index: s for g in buffer.get_train_groups(100) for s in g}
    finally:
        for c in clients:
            c.update_weights_from_disk(engine_group.config.model_path, weight_version="default")
            c.close()
    assert set(aborted) <= set(finished)  # the resumed samples came back first
    for index, n_old in aborted.items():
        s = finished[index]
        assert s.weight_versions[:n_old] == [0] * n_old  # tokens made before the abort keep version 0
        assert s.response_length > n_old and set(s.weight_versions[n_old:]) == {1}
        s.check()


def rollout_and_kill(cfg, buffer, victim: int) -> int:
    """One rollout; once groups are in flight and mid-response, kill -9 `victim`. Returns the number of
    groups that were in flight at the kill."""
    async def run():
        task = asyncio.create_task(generate_rollout(cfg, 0, buffer))
        started = time.monotonic()  # a loaded machine may take seconds to get the first groups out
        while buffer.num_in_flight() == 0 and not task.done() and time.monotonic() - started < 60:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the engines get into the middle of their responses
        in_flight = buffer.num_in_flight()
        os.kill(victim, signal.SIGKILL)
        await task
        return in_flight

    return asyncio.run(asyncio.wait_for(run(), 600))


# slow (suite time, issue 24): tests/e2e/test_engine_faults.py kills an engine with -9 inside the real loop by default
@pytest.mark.slow
def test_kill_9_one_engine_mid_rollout_every_sample_arrives_once(engine_group, prompts_file):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-max-response-len", "200", "--rollout-ignore-eos",
                   "--rm-type", "exact")
    buffer = create_data_buffer(cfg)
    victim = engine_group.pids()["engine-1"][0]
    with EngineMonitor(engine_group, interval_s=0.5) as monitor:
        in_flight_at_kill = rollout_and_kill(cfg, buffer, victim)
        deadline = time.monotonic() + 300
        while monitor.total_restarts < 1 or len(engine_group.router.worker_urls()) < 2:
            assert time.monotonic() < deadline, monitor.health
            time.sleep(1)
    samples = ready_samples(buffer)
    assert len(samples) == 64 and len({s.index for s in samples}) == 64
    assert sorted({s.group_index for s in samples}) == sorted({s.group_index for s in samples})[:16]
    assert all(s.status is Status.TRUNCATED and s.response_length == 200 for s in samples)  # none half-counted
    assert engine_group.engine_alive(1) and victim not in engine_group.pids()["engine-1"]
    assert any("process exited" in e for e in monitor.health[1].events)
    # the kill hit a rollout in progress: groups were still generating (the requests on the dead engine
    # were retried, by the router itself or by generate_with_retries, and none was lost or duplicated)
    assert in_flight_at_kill > 0


def test_evaluation_reports_mean_reward_and_pass_at_k_per_set(engine_group, prompts_file, tmp_path, user_plugins):
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": w, "label": w}) + "\n" for w in WORDS[:3]))
    cfg = make_cfg(engine_group, prompts_file, "--custom-rm-path", "rollout_plugins.length_rm",
                   "--eval-prompt-data", "main", str(prompts_file), "--eval-prompt-data", "small", str(other),
                   "--n-samples-per-eval-prompt", "3", "--eval-max-response-len", "8")
    out = asyncio.run(generate_rollout(cfg, 0, buffer=None, evaluation=True))
    assert len(out.samples["main"]) == 16 * 3 and len(out.samples["small"]) == 3 * 3
    for name in ("main", "small"):
        rewards = [s.reward for s in out.samples[name]]
        assert out.metrics[f"eval/{name}/reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
        assert 0.0 <= out.metrics[f"eval/{name}/pass@1"] <= out.metrics[f"eval/{name}/pass@3"] <= 1.0
        assert all(s.response_length <= 8 for s in out.samples[name])


def test_eval_config_gives_each_set_its_own_samples_sampling_reward_and_keys(engine_group, prompts_file, tmp_path,
                                                                            user_plugins):
    """slime's --eval-config: per-set n_samples_per_eval_prompt, max_response_len, reward and input key."""
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"question": w, "label": w}) + "\n" for w in WORDS[:3]))
    config = tmp_path / "eval.yaml"
    config.write_text(f"""eval:
  defaults:
    n_samples_per_eval_prompt: 2
    max_response_len: 6
  datasets:
    - name: main
      path: {prompts_file}
    - name: exact
      path: {other}
      input_key: question
      n_samples_per_eval_prompt: 3
      max_response_len: 3
      rm_type: exact
""")
    cfg = make_cfg(engine_group, prompts_file, "--custom-rm-path", "rollout_plugins.token_checksum_rm",
                   "--eval-config", str(config))
    out = asyncio.run(generate_rollout(cfg, 0, buffer=None, evaluation=True))
    assert len(out.samples["main"]) == 16 * 2 and len(out.samples["exact"]) == 3 * 3
    assert all(s.response_length <= 6 for s in out.samples["main"])
    assert all(s.response_length <= 3 for s in out.samples["exact"])
    assert {s.prompt for s in out.samples["exact"]} == set(WORDS[:3])  # read with its own input key
    # the run's reward (a checksum of the tokens) on main; exact match (0 or 1) on the other
    assert all(s.reward > 1.0 for s in out.samples["main"])
    assert {s.reward for s in out.samples["exact"]} <= {0.0, 1.0}
    assert out.metrics["eval/exact/reward_mean"] == pytest.approx(
        sum(s.reward for s in out.samples["exact"]) / 9)


def test_a_slime_rollout_function_over_slimes_data_source_fills_the_buffer(engine_group, prompts_file, tmp_path,
                                                                          user_plugins, monkeypatch):
    """slime's rollout-function contract with an unchanged slime-style file (tests/e2e/slime_style/
    multi_agent_rollout.py): slime's data source is the buffer, a fan-out to two agents comes back as
    groups of lean_rl samples with exact versions; the solver's reward is the function's, the reviewer's
    the run's --custom-rm-path. (Its 3-step training run with slime's advantage and TIS functions:
    tests/e2e/test_slime_compat_run.py, slow.)"""
    from lean_rl.rollout.base import call_rollout_function, installed_extensions

    monkeypatch.syspath_prepend(str(REPO / "tests" / "e2e" / "slime_style"))
    custom = tmp_path / "agents.yaml"
    custom.write_text("agent_tokens: 5\n")
    cfg = make_cfg(engine_group, prompts_file, "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                   "--custom-rm-path", "rollout_plugins.token_checksum_rm", "--custom-config-path", str(custom),
                   "--rollout-function-path", "multi_agent_rollout.generate_rollout")
    buffer = create_data_buffer(cfg)
    out = asyncio.run(call_rollout_function(cfg, installed_extensions(cfg).rollout, 0, buffer, False))
    assert out.metrics["multi_agent/agents_per_sample"] == 2.0 and out.metrics["rollout/groups"] == 2
    groups = buffer.get_train_groups(10)
    assert [len(g) for g in groups] == [4, 4] and buffer.num_in_flight() == 0  # every group handed out came back
    for group in groups:
        solvers = [s for s in group if s.index < 1_000_000]
        reviewers = [s for s in group if s.index >= 1_000_000]
        assert len(solvers) == len(reviewers) == 2 and len({s.group_index for s in group}) == 1
        for s in group:
            s.check()
            assert 0 < s.response_length <= 5 and all(s.loss_mask)
        assert all(0.0 <= s.reward <= 1.0 for s in solvers)  # the function's own reward
        assert all(s.reward > 1.0 for s in reviewers)  # left unset by the function: the run's checksum reward
        assert all(r.prompt.endswith("\nAgain:") for r in reviewers)
    # every token's version is the one policy the engines served (exact, from the answers `post` saw)
    assert len({v for g in groups for s in g for v in s.weight_versions}) == 1


def test_evaluation_counts_failed_generations_and_stops_past_its_threshold(engine_group, prompts_file,
                                                                           user_plugins):
    flags = ("--custom-rm-path", "rollout_plugins.length_rm", "--custom-generate-function-path",
             "rollout_plugins.sometimes_bad_request_generate", "--eval-prompt-data", "main", str(prompts_file),
             "--eval-max-response-len", "4")
    out = asyncio.run(generate_rollout(make_cfg(engine_group, prompts_file, *flags), 0, buffer=None, evaluation=True))
    assert out.metrics["eval/main/failed"] == 6.0  # prompts 0, 3, ..., 15 of 16
    assert len(out.samples["main"]) == 10 and all(s.reward is not None for s in out.samples["main"])
    strict = make_cfg(engine_group, prompts_file, *flags, "--eval-max-failed-fraction", "0.25")
    with pytest.raises(EvaluationFailedError, match="evaluation main: 6 of 16 samples failed to generate"):
        asyncio.run(generate_rollout(strict, 0, buffer=None, evaluation=True))


def test_kill_9_the_router_mid_rollout_it_is_restarted_and_every_sample_arrives(engine_group, prompts_file):
    cfg = make_cfg(engine_group, prompts_file, "--rollout-max-response-len", "200", "--rollout-ignore-eos",
                   "--rm-type", "exact")
    buffer = create_data_buffer(cfg)
    router = engine_group.pids()["router"][0]
    with EngineMonitor(engine_group, interval_s=0.5) as monitor:
        in_flight_at_kill = rollout_and_kill(cfg, buffer, router)
    samples = ready_samples(buffer)
    assert in_flight_at_kill > 0
    assert len(samples) == 64 and len({s.index for s in samples}) == 64
    assert all(s.status is Status.TRUNCATED and s.response_length == 200 for s in samples), \
        [s.metadata.get("last_generate_error") for s in samples if s.status is not Status.TRUNCATED][:3]
    assert monitor.router_restarts == 1 and "process exited" in monitor.router_events[0], monitor.router_events
    print("router events:", monitor.router_events)
    assert router not in engine_group.pids()["router"]
    assert engine_group.router.worker_urls() == set(engine_group.engine_urls)  # both engines routed again
