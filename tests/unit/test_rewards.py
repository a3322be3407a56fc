import asyncio
import collections
import types

import pytest

from lean_rl.rollout.rewards import (boxed_match, exact_match, last_boxed, math_reward, score_group,
                                     token_f1)
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
    return types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=timeout, rm_retries=0, rm_url=None))


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
        cfg = types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=5.0, rm_retries=2, rm_url=url))
        sample = _sample("my answer", "gold")
        assert asyncio.run(remote_reward(cfg, sample)) == 0.5
        assert len(calls) == 2 and calls[1]["response"] == "my answer" and calls[1]["label"] == "gold"
    finally:
        server.shutdown()
    dead = types.SimpleNamespace(reward=types.SimpleNamespace(rm_timeout=1.0, rm_retries=1, rm_url=url))
    with pytest.raises(RuntimeError, match=r"--rm-url http://127\.0\.0\.1:\d+/score: no answer after 2 tries"):
        asyncio.run(remote_reward(dead, sample))
