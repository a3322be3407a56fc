"""The router gateway slime's foreign HTTP clients reach at args.sglang_router_ip/port
(lean_rl/slime_compat/router_gateway.py): it binds loopback, forwards the generation and read-only
paths only, adds the run's key (to a router that proves to be the run's), and records the per-token
policy versions of the /generate answers it relays (for every slime call running now) and the
versions of chat answers by their text. The router is a stand-in in a child process started with
the run's key, as the real one is; the gateway is the real one, reached over HTTP as strands_sglang
and the OpenAI client reach it."""

import asyncio
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest

from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV
from lean_rl.config import parse_config
from lean_rl.slime_compat.router_gateway import relayed_text_versions, rollout_args, router_gateway
from lean_rl.slime_compat.run_state import bind_run, recording
from lean_rl.utils.net import find_free_port

GENERATE = {"text": "abc", "output_ids": [5, 6, 7],
            "meta_info": {"finish_reason": {"type": "stop"}, "weight_version": "2", "weight_versions": [["1", 0, 1]],
                          "prompt_tokens": 2, "completion_tokens": 3}}
CHAT = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "the gateway's chat answer"}}],
        "metadata": {"weight_version": "6"}}

ROUTER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, log = int(sys.argv[1]), sys.argv[2]
answers = {"/generate": %r, "/v1/chat/completions": %r}
class Handler(BaseHTTPRequestHandler):
    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(log, "a") as f:
            f.write(json.dumps([self.command, self.path, self.headers.get("Authorization"), body.decode()]) + "\\n")
        out = json.dumps(answers.get(self.path.split("?")[0], {"ok": True})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = _answer
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
""" % (GENERATE, CHAT)


@pytest.fixture
def run(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "label": "4"}) + "\n")
    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data),
                        "--output-dir", str(tmp_path / "out")])
    port = find_free_port("127.0.0.1")
    log = tmp_path / "router.jsonl"
    log.touch()
    env = {**{k: v for k, v in os.environ.items() if k != CHILD_API_KEY_ENV}, CHILD_API_KEY_ENV: cfg.engines.api_key}
    proc = subprocess.Popen([sys.executable, "-c", ROUTER, str(port), str(log)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False)
            break
        except httpx.TransportError:
            assert proc.poll() is None and time.monotonic() < deadline, "the stand-in router did not start"
            time.sleep(0.05)
    cfg.engines.live.publish(["http://127.0.0.1:9"], f"http://127.0.0.1:{port}")
    bind_run(cfg)
    seen = [line for line in log.read_text().splitlines()]
    yield SimpleNamespace(cfg=cfg, seen=lambda: [json.loads(x) for x in log.read_text().splitlines()[len(seen):]])
    proc.kill()
    proc.wait()


def test_slimes_args_name_a_loopback_gateway_that_adds_the_key_and_forwards_generation_only(run):
    args = rollout_args(run.cfg)
    assert (args.sglang_router_ip, args.sglang_router_port) == router_gateway(run.cfg).address
    assert args.sglang_router_ip == "127.0.0.1"  # loopback, never the node's address nor 0.0.0.0
    base = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    with httpx.Client(trust_env=False, timeout=30) as client:  # as a foreign client calls it: no key
        assert client.post(f"{base}/generate", json={"input_ids": [1, 2]}).json() == GENERATE
        assert client.get(f"{base}/model_info").status_code == 200
        for method, path in (("POST", "/update_weights_from_disk"), ("POST", "/abort_request"),
                             ("POST", "/flush_cache"), ("GET", "/workers")):
            refused = client.request(method, f"{base}{path}", json={})
            assert refused.status_code == 404 and "not forwarded" in refused.json()["error"]["message"]
    seen = run.seen()
    assert [(m, p) for m, p, _, _ in seen if p != "/health"] == [("POST", "/generate"), ("GET", "/model_info")]
    assert all(auth == f"Bearer {run.cfg.engines.api_key}" for _, p, auth, _ in seen if p != "/health")


def test_relayed_generate_answers_reach_every_running_slime_call_with_per_token_versions(run):
    args = rollout_args(run.cfg)
    base = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"

    async def two_calls():
        # both calls are running (recording) before either posts, and until both have their answer
        recording_both, answered_both = asyncio.Barrier(2), asyncio.Barrier(2)

        async def call():
            with recording() as answers:
                await recording_both.wait()
                async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
                    await client.post(f"{base}/generate", json={"input_ids": [1]})
                await answered_both.wait()
                return answers
        return await asyncio.gather(call(), call())

    first, second = asyncio.run(two_calls())
    # each call sees both answers (a foreign request names no call); the versions are per token: the
    # span says token 0 came from version 1, the rest from the answer's version 2
    for answers in (first, second):
        assert len(answers) == 2 and all(a.relayed for a in answers)
        assert all(a.output_ids == [5, 6, 7] and a.versions == [1, 2, 2] for a in answers)
    with recording() as after:
        pass
    assert after == []  # a call that started later does not get earlier answers


def test_chat_answers_are_recorded_by_text_and_slimes_own_post_skips_the_gateway(run):
    from lean_rl.slime_compat.http_utils import post

    args = rollout_args(run.cfg)
    base = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    answer = httpx.post(f"{base}/v1/chat/completions", json={"messages": []}, trust_env=False, timeout=30)
    assert answer.status_code == 200
    assert relayed_text_versions.versions_within("<think></think> the gateway's chat answer<|im_end|>") == {6}
    before, forwarded = len(run.seen()), router_gateway(run.cfg).forwarded
    assert asyncio.run(post(f"{base}/generate", {"input_ids": [3]})) == GENERATE
    assert router_gateway(run.cfg).forwarded == forwarded
    direct = run.seen()[before:]  # reached the router itself, with the key: no second hop through the gateway
    assert [(p, auth) for _, p, auth, _ in direct if p != "/health"] == [("/generate", f"Bearer {run.cfg.engines.api_key}")]
