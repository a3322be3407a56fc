"""The served reward model's client (rollout/reward_model.py) against servers on loopback that stand in
for its SGLang group (a router's /workers and a server's /classify): each request goes to a server the
router lists as healthy, a reward model that fails or is dead fails the sample within its deadline with
an error naming it, counted, and never becomes a reward. (The real servers: tests/integration/test_reward_engines.py.)"""

import asyncio
import collections
import dataclasses
import json
import socket
import time

import pytest
from aiohttp import web

from lean_rl.backends.sglang.live_endpoints import LiveEndpoints
from lean_rl.config import parse_config
from lean_rl.rollout.reward_model import reward_model_reward
from lean_rl.rollout.rewards import score_group
from lean_rl.sample import Sample, Status
from lean_rl.testing.tiny_reward_model import make_tiny_reward_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reward_model(tiny_qwen2, tmp_path_factory):
    return make_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", tiny_qwen2)


def _cfg(tiny_qwen2, rm, tmp_path, router: str, engines: tuple[str, ...], retries: int = 1):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a", "label": "b"}) + "\n")
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts), "--rm-hf-checkpoint",
                        str(rm), "--rollout-request-retries", str(retries), "--engine-request-timeout", "5",
                        "--sglang-api-key", "none"])  # the stand-ins are not processes keyed by the run
    live = LiveEndpoints()
    live.publish(engines, router)  # where the group's servers and router run
    rm_engines = dataclasses.replace(cfg.reward_serving.rm_engines, live=live)
    return dataclasses.replace(cfg, reward_serving=dataclasses.replace(cfg.reward_serving, rm_engines=rm_engines))


def _samples(n: int) -> list[Sample]:
    out = []
    for i in range(n):
        s = Sample(index=i, group_index=0, prompt="p", tokens=[5, 6, 7], label="x")
        s.append_response([8 + i], log_probs=[-1.0], weight_versions=0)
        s.response, s.status = "r", Status.COMPLETED
        out.append(s)
    return out


async def _serve(classify_status: int) -> tuple[web.AppRunner, str, list[dict]]:
    """One server that is both the router (/workers: itself healthy) and a reward model server."""
    seen: list[dict] = []
    port = _free_port()
    url = f"http://127.0.0.1:{port}"

    async def workers(_request):
        return web.json_response({"workers": [{"url": url, "is_healthy": True}]})

    async def classify(request):
        body = await request.json()
        seen.append(body)
        if classify_status != 200:
            return web.json_response({"error": "boom"}, status=classify_status)
        return web.json_response({"embedding": [len(body["input_ids"]) / 10]})

    app = web.Application()
    app.add_routes([web.get("/workers", workers), web.post("/classify", classify)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, url, seen


def test_requests_go_to_the_servers_the_router_lists_as_healthy(tiny_qwen2, reward_model, tmp_path):
    async def main():
        runner, url, seen = await _serve(200)
        dead = f"http://127.0.0.1:{_free_port()}"
        cfg = _cfg(tiny_qwen2, reward_model, tmp_path, router=url, engines=(dead, url), retries=0)
        samples, counters = _samples(4), collections.Counter()
        try:
            await score_group(cfg, samples, reward_model_reward, False, counters)
        finally:
            await runner.cleanup()
        return samples, counters, seen

    samples, counters, seen = asyncio.run(main())
    assert not counters, samples[0].metadata
    assert len(seen) == 4  # none went to the dead server (which would cost a retry)
    assert all(s.status is Status.COMPLETED and s.reward == pytest.approx(0.4) for s in samples)


@pytest.mark.parametrize("dead", [False, True], ids=["answers-500", "dead"])
def test_a_failing_or_dead_reward_model_fails_the_sample_within_its_deadline(tiny_qwen2, reward_model, tmp_path,
                                                                            dead):
    async def main():
        runner, url, seen = await _serve(500)
        if dead:  # nothing listens: neither the router nor the servers
            await runner.cleanup()
        # a dead one: one try (the client's own connect retries take seconds each); a failing one: two
        cfg = _cfg(tiny_qwen2, reward_model, tmp_path, router=url, engines=(url,), retries=0 if dead else 1)
        samples, counters = _samples(2), collections.Counter()
        started = time.monotonic()
        try:
            await score_group(cfg, samples, reward_model_reward, False, counters)
        finally:
            await runner.cleanup()
        return samples, counters, seen, time.monotonic() - started

    samples, counters, seen, seconds = asyncio.run(main())
    # the client's connect retries are bounded; score_group's deadline per sample (3 x --rm-timeout + 5 s =
    # 95 s) is the bound of last resort
    assert seconds < 60
    assert counters["reward_failed"] == 2 and len(seen) == (0 if dead else 4)  # 2 samples x 2 tries
    for s in samples:
        assert s.status is Status.FAILED and s.reward == 0.0  # not a score: the sample trains nothing
        error = s.metadata["reward_error"]
        assert error.startswith("RewardModelError: the reward model (--rm-hf-checkpoint ")
        assert f"in {1 if dead else 2} tries" in error
        assert ("connect" in error.lower()) if dead else ("HTTP 500" in error)
