"""A remote judge's (--judge-url) and reward server's (--rm-url) API key, named by --judge-api-key-env /
--rm-api-key-env: read from the environment, sent as `Authorization: Bearer` (checked by a real HTTP
server on loopback), never on the command line or in the config's repr; one-line errors otherwise."""

import asyncio
import collections
import json
import socket

import pytest
from aiohttp import web

from lean_rl.config import parse_config
from lean_rl.options import ConfigError
from lean_rl.rollout import judge as judge_module
from lean_rl.rollout.judge import prepare_judge
from lean_rl.rollout.rewards import remote_reward, score_group
from lean_rl.sample import Sample, Status

KEY = "s3cret-judge-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base(tiny_qwen2, tmp_path) -> list[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a", "label": "b"}) + "\n")
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(prompts)]


def _sample() -> Sample:
    s = Sample(index=0, group_index=0, prompt="the cat sat on the", tokens=[5, 6, 7], label="mat")
    s.append_response([8], log_probs=[-1.0], weight_versions=0)
    s.response, s.status = " mat", Status.COMPLETED
    return s


async def _with_server(run):
    """`await run(url, seen)` while a server records each request's Authorization header in `seen`: a
    judge (/v1/chat/completions, answers "Rating: 7") and a reward server (/reward, answers 0.25)."""
    seen: list[str | None] = []

    async def chat(request):
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"choices": [{"message": {"content": "Rating: 7"}}]})

    async def reward(request):
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"reward": 0.25})

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", chat), web.post("/reward", reward)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        return await run(f"http://127.0.0.1:{port}", seen)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("with_key", [True, False])
def test_the_judge_gets_the_key_of_the_named_variable_as_a_bearer_header(tiny_qwen2, tmp_path, monkeypatch,
                                                                         with_key):
    monkeypatch.setenv("MY_JUDGE_KEY", KEY)
    judge_module._prepared.clear()

    async def run(url, seen):
        flags = ["--judge-url", url, "--judge-retries", "0"] + (["--judge-api-key-env", "MY_JUDGE_KEY"] if with_key else [])
        cfg = parse_config(_base(tiny_qwen2, tmp_path) + flags)
        assert KEY not in repr(cfg)
        sample, counters = _sample(), collections.Counter()
        await score_group(cfg, [sample], prepare_judge(cfg), False, counters)
        return sample, counters

    seen: list = []
    sample, counters = asyncio.run(_with_server(lambda url, server_seen: _record(run, url, server_seen, seen)))
    assert not counters and sample.reward == pytest.approx(0.7)
    assert seen == ([f"Bearer {KEY}"] if with_key else [None])


async def _record(run, url, server_seen, seen):
    """`await run(url, server_seen)`, the headers the server saw copied into `seen` for the test."""
    try:
        return await run(url, server_seen)
    finally:
        seen.extend(server_seen)


def test_the_reward_server_gets_the_key_of_the_named_variable(tiny_qwen2, tmp_path, monkeypatch):
    monkeypatch.setenv("RM_KEY", KEY)
    seen: list = []

    async def run(url, server_seen):
        cfg = parse_config(_base(tiny_qwen2, tmp_path) + ["--rm-type", "remote", "--rm-url", f"{url}/reward",
                                                          "--rm-api-key-env", "RM_KEY"])
        assert KEY not in repr(cfg)
        return await remote_reward(cfg, _sample())

    reward = asyncio.run(_with_server(lambda url, s: _record(run, url, s, seen)))
    assert reward == 0.25 and seen == [f"Bearer {KEY}"]


@pytest.mark.parametrize("flags, message", [
    (["--judge-url", "http://127.0.0.1:1", "--judge-api-key-env", "UNSET_KEY_VAR"],
     r"^--judge-api-key-env UNSET_KEY_VAR: the environment variable UNSET_KEY_VAR is not set"),
    (["--judge-url", "http://127.0.0.1:1", "--judge-api-key-env", "sk-live-123"],
     r"^--judge-api-key-env 'sk-live-123': give the NAME of an environment variable"),
    (["--judge-api-key-env", "SET_KEY_VAR", "--custom-rm-path", "x.y"], r"^--judge-api-key-env names the key of a "
                                                                        r"remote judge: add --judge-url"),
    (["--rm-type", "remote", "--rm-url", "http://127.0.0.1:1", "--rm-api-key-env", "UNSET_KEY_VAR"],
     r"^--rm-api-key-env UNSET_KEY_VAR: the environment variable UNSET_KEY_VAR is not set"),
    (["--rm-api-key-env", "SET_KEY_VAR", "--rm-type", "exact"], r"^--rm-api-key-env names the key of --rm-url"),
])
def test_a_missing_key_is_one_line_naming_the_flag(tiny_qwen2, tmp_path, monkeypatch, flags, message):
    monkeypatch.delenv("UNSET_KEY_VAR", raising=False)
    monkeypatch.setenv("SET_KEY_VAR", KEY)
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(_base(tiny_qwen2, tmp_path) + flags)
    assert "\n" not in str(err.value) and KEY not in str(err.value)
