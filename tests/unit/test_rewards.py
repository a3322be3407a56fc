import asyncio
import collections
import types

import pytest

from lean_rl.rollout.rewards import (BUILTIN_REWARDS, boxed_match, exact_match, last_boxed, math_reward, remote_reward,
                                    token_f1)
from lean_rl.rollout.reward_scoring import NEVER_WAITS, never_waits, score_group
from lean_rl.sample import Sample, Status


def test_last_boxed_handles_nested_braces_and_picks_the_last():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} end") == r"\frac{1}{2}"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{unclosed") is None


def test_exact_boxed_and_f1():
    assert exact_match("  Paris. ", "paris") == 1.0 and exact_match("Paris", "London") == 0.0
    assert boxed_match(r"so \boxed{42}", "42") == 1.0 and boxed_match("42", "42") == 0.0
    assert token_f1("the cat sat", "the cat") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert token_f1("dog", "cat") == 0.0


def _cfg(timeout=5.0):
    return types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=timeout, rm_retries=0, rm_url=None,
                                                              reward_key=None))


def _sample(response, label):
    s = Sample(index=0, group_index=0, prompt="q", tokens=[1], label=label)
    s.response = response
    return s


def test_math_reward_uses_math_verify_equivalence():
    cfg = _cfg()
    assert asyncio.run(math_reward(cfg, _sample(r"The answer is $\frac{1}{2}$", "0.5"))) == 1.0
    assert asyncio.run(math_reward(cfg, _sample(r"so \boxed{3}", "4"))) == 0.0


def test_a_raising_or_slow_reward_marks_failed_and_counts():
    async def flaky(cfg, sample):
        if sample.response == "boom":
            raise RuntimeError("reward crashed")
        if sample.response == "slow":
            await asyncio.sleep(60)
        return 1.0

    samples = [_sample("ok", "x"), _sample("boom", "x"), _sample("slow", "x")]
    counters = collections.Counter()
    asyncio.run(score_group(_cfg(timeout=0.1), samples, flaky, group_rm=False, counters=counters))
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]
    assert [s.status for s in samples] == [Status.PENDING, Status.FAILED, Status.FAILED]
    assert "reward crashed" in samples[1].metadata["reward_error"]
    assert counters["reward_failed"] == 2


@pytest.mark.parametrize("name", ["exact", "boxed", "f1"])
def test_the_rule_rewards_marked_never_waits_finish_on_their_first_step(name):
    reward = BUILTIN_REWARDS[name]
    assert getattr(reward, NEVER_WAITS, False)
    step = reward(_cfg(), _sample(r"so \boxed{x}", "x"))
    with pytest.raises(StopIteration):  # done without suspending once: no timer could ever fire on it
        step.send(None)


def test_rewards_that_wait_are_not_marked():
    assert not getattr(math_reward, NEVER_WAITS, False) and not getattr(remote_reward, NEVER_WAITS, False)


def test_a_never_waits_reward_scores_each_sample_and_a_raise_fails_only_its_own():
    @never_waits
    async def picky(cfg, sample):
        if sample.response == "boom":
            raise RuntimeError("reward crashed")
        return float(sample.response == sample.label)

    samples = [_sample("x", "x"), _sample("boom", "x"), _sample("y", "x")]
    samples[2].status = Status.FAILED
    counters = collections.Counter()
    asyncio.run(score_group(_cfg(), samples, picky, group_rm=False, counters=counters))
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]
    assert [s.status for s in samples] == [Status.PENDING, Status.FAILED, Status.FAILED]
    assert "reward crashed" in samples[1].metadata["reward_error"] and counters["reward_failed"] == 1


def test_group_reward_length_mismatch_fails_the_group():
    async def group_rm(cfg, samples):
        return [1.0]

    samples = [_sample("a", "x"), _sample("b", "x")]
    counters = collections.Counter()
    asyncio.run(score_group(_cfg(), samples, group_rm, group_rm=True, counters=counters))
    assert all(s.status is Status.FAILED and s.reward == 0.0 for s in samples) and counters["reward_failed"] == 2


def test_remote_reward_retries_server_errors_and_names_the_url_when_it_gives_up():
    import http.server
    import json
    import threading

    calls = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body)
            status, payload = (500, b"busy") if len(calls) == 1 else (200, json.dumps({"reward": 0.5}).encode())
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from lean_rl.rollout.rewards import remote_reward

        url = f"http://127.0.0.1:{server.server_address[1]}/score"
        cfg = types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=5.0, rm_retries=2, rm_url=url,
                                                                   rm_api_key_env=None))
        sample = _sample("my answer", "gold")
        assert asyncio.run(remote_reward(cfg, sample)) == 0.5
        assert len(calls) == 2 and calls[1]["response"] == "my answer" and calls[1]["label"] == "gold"
    finally:
        server.shutdown()
    dead = types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=1.0, rm_retries=1, rm_url=url,
                                                                rm_api_key_env=None))
    with pytest.raises(RuntimeError, match=r"--rm-url http://127\.0\.0\.1:\d+/score: no answer after 2 tries"):
        asyncio.run(remote_reward(dead, sample))


def _keyed_cfg(reward_key=None, eval_reward_key=None):
    cfg = _cfg()
    cfg.reward.reward_key, cfg.reward.custom_rm_path, cfg.reward.rm_type = reward_key, "my_hooks.rm", None
    cfg.eval = types.SimpleNamespace(reward_key=eval_reward_key)
    cfg.rollout = types.SimpleNamespace(custom_generate_function_path="my_hooks.gen",
                                        generate_function_flag="--custom-generate-function-path my_hooks.gen")
    return cfg


def _score(cfg, samples, reward_fn, group_rm=False, evaluation=False):
    counters = collections.Counter()
    asyncio.run(score_group(cfg, samples, reward_fn, group_rm=group_rm, counters=counters, evaluation=evaluation))
    return counters


async def _graded(cfg, sample):
    return {"acc": float(sample.response == sample.label), "format": 0.5, "len": len(sample.response)}


def test_a_dict_reward_trains_on_its_reward_key_and_keeps_the_whole_dict():
    samples = [_sample("4", "4"), _sample("5", "4")]
    _score(_keyed_cfg("acc"), samples, _graded)
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert samples[0].metadata["rewards"] == {"acc": 1.0, "format": 0.5, "len": 1.0}
    evaluated = [_sample("4", "4")]  # --eval-reward-key in evaluation
    _score(_keyed_cfg("acc", eval_reward_key="format"), evaluated, _graded, evaluation=True)
    assert evaluated[0].reward == 0.5


def test_group_rewards_may_be_dicts_too():
    async def group(cfg, samples):
        return [{"acc": 1.0, "bonus": 2.0}, 0.25]

    samples = [_sample("a", "x"), _sample("b", "x")]
    _score(_keyed_cfg("acc"), samples, group, group_rm=True)
    assert [s.reward for s in samples] == [1.0, 0.25] and samples[0].metadata["rewards"]["bonus"] == 2.0


@pytest.mark.parametrize("key, value, message", [
    (None, {"acc": 1.0}, r"returned dict .* so pass --reward-key to choose the entry"),
    ("score", {"acc": 1.0}, r"the dict has no entry 'score' \(--reward-key / --eval-reward-key\); its keys are \['acc'\]"),
    ("acc", {"acc": "high"}, r"entry 'acc' is not a number"),
])
def test_a_bad_dict_reward_stops_the_run_naming_flag_and_key(key, value, message):
    from lean_rl.utils.plugins import HookReturnError

    async def rm(cfg, sample):
        return value

    with pytest.raises(HookReturnError, match=rf"^--custom-rm-path my_hooks\.rm .*{message}"):
        _score(_keyed_cfg(key), [_sample("a", "x")], rm)


def test_a_reward_set_by_the_generate_function_is_kept_and_not_scored_again():
    called = []

    async def rm(cfg, sample):
        called.append(sample.index)
        return 0.0

    preset, preset_dict, fresh, failed = (_sample(t, "x") for t in ("a", "b", "c", "d"))
    for i, s in enumerate((preset, preset_dict, fresh, failed)):
        s.index = i
    preset.reward, preset_dict.reward = 0.75, {"acc": 1.0, "turns": 3}
    failed.status, failed.reward = Status.FAILED, {"acc": 1.0}
    _score(_keyed_cfg("acc"), [preset, preset_dict, fresh, failed], rm)
    assert called == [2]  # only the sample without a reward is scored
    assert [preset.reward, preset_dict.reward, fresh.reward, failed.reward] == [0.75, 1.0, 0.0, 0.0]
    assert preset_dict.metadata["rewards"] == {"acc": 1.0, "turns": 3.0}

    group_calls = []

    async def group(cfg, samples):
        group_calls.append(len(samples))
        return [0.0] * len(samples)

    all_set = [_sample("a", "x"), _sample("b", "x")]
    all_set[0].reward, all_set[1].reward = 1.0, 0.5
    _score(_keyed_cfg(), all_set, group, group_rm=True)
    assert group_calls == [] and [s.reward for s in all_set] == [1.0, 0.5]  # nothing to score: not called
    some_set = [_sample("a", "x"), _sample("b", "x")]
    some_set[0].reward = 1.0
    _score(_keyed_cfg(), some_set, group, group_rm=True)
    assert group_calls == [2] and [s.reward for s in some_set] == [1.0, 0.0]  # the whole group seen, one set


def test_a_preset_reward_of_the_wrong_type_names_the_generate_function():
    from lean_rl.utils.plugins import HookReturnError

    sample = _sample("a", "x")
    sample.reward = "1"
    with pytest.raises(HookReturnError, match=r"^--custom-generate-function-path my_hooks\.gen \(sample\.reward\) "
                                              r"\(my_hooks\.gen\) returned str '1'"):
        _score(_keyed_cfg(), [sample], None)


def test_every_entry_of_dict_rewards_is_a_rollout_metric():
    from lean_rl.rollout.metrics import rollout_metrics

    samples = [_sample("4", "4"), _sample("5", "4"), _sample("4", "4")]
    samples[2].status = Status.FAILED  # left out of the means
    _score(_keyed_cfg("acc"), samples[:2], _graded)
    samples[2].metadata["rewards"] = {"acc": 1.0, "format": 9.0}
    metrics = rollout_metrics([samples])
    assert metrics["rollout/reward/acc_mean"] == 0.5 and metrics["rollout/reward/format_mean"] == 0.5
    assert metrics["rollout/reward/len_mean"] == 1.0 and metrics["rollout/reward_mean"] == 0.5


def test_the_flag_offers_exactly_the_builtin_rewards():
    from lean_rl.rollout.config import BUILTIN_REWARD_TYPES
    from lean_rl.rollout.rewards import BUILTIN_REWARDS

    assert sorted(BUILTIN_REWARD_TYPES) == sorted(BUILTIN_REWARDS)


def test_multi_turn_samples_report_how_many_episodes_went_past_their_first_turn():
    from lean_rl.rollout.metrics import rollout_metrics

    samples = [_sample("4", "4") for _ in range(4)]
    for sample, turns in zip(samples, (1, 2, 3, 1)):
        sample.metadata["turns"] = [{"output_tokens": 1}] * turns
    metrics = rollout_metrics([samples])
    assert metrics["rollout/multi_turn_fraction"] == 0.5 and metrics["rollout/turns_mean"] == 1.75
    assert "rollout/multi_turn_fraction" not in rollout_metrics([[_sample("4", "4")]])  # single-turn samples
