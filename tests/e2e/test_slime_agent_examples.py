"""slime's examples whose HTTP clients lean_rl did not write, run unchanged (vendored from THUDM/slime at
624b824 under tests/e2e/slime_examples/, Apache-2.0) through `python -m lean_rl.slime_launch train.py`:
strands_sglang (strands-agents with strands-sglang's own aiohttp client posting /generate to
`args.sglang_router_ip:port`, which is lean_rl's router gateway: it adds the run's key and records the
policy version of every token it relays) and slime_plugins/rollout_buffer (its FastAPI buffer server
and generator processes, whose OpenAI client posts /v1/chat/completions to the gateway; the rollout
function builds finished Samples from the conversations, re-tokenized, and hands them to
data_buffer.add_samples). Real SGLang, router, Megatron and Ray, the tiny model; every sample trains
(none FAILED) with the per-token versions of the answers the gateway saw.

strands-agents / strands-sglang are an optional extra (requirements-slime-examples.txt, installed into
.slime-example-deps/ beside the venv, not into it): the test is slow and skipped without them."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import REPO, read_metrics, run_lean_rl
from test_slime_examples import EXAMPLES, QUESTIONS, STEPS, run_example, slime_flags, write_rows

from lean_rl.utils.net import find_free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXTRA = REPO / ".slime-example-deps"
INSTALL = ".venv/bin/pip install --no-deps --target .slime-example-deps -r requirements-slime-examples.txt"


@pytest.fixture
def example_deps(monkeypatch):
    if not (EXTRA / "strands_sglang").is_dir() or not (EXTRA / "strands").is_dir():
        pytest.skip(f"the optional extra of slime's agent examples is not installed ({INSTALL})")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(EXTRA)]))


def test_strands_sglang_runs_unchanged(tiny_qwen2, tmp_path, example_deps):
    data = tmp_path / "dapo.jsonl"
    # dapo-math-17k's shape: a message list, which the example reads itself (it asks for no
    # --apply-chat-template: strands renders the conversation), handed over as it is
    write_rows(data, [{"prompt": [{"role": "user", "content": q}], "label": a} for q, a in QUESTIONS])
    # strands_qwen3_8b.sh's flags for its functions; slime_flags' --apply-chat-template dropped
    flags = [f for f in slime_flags(tiny_qwen2, data, tmp_path, "--label-key", "label",
                                    "--rollout-max-response-len", "24", "--context-parallel-size", "1",
                                    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048",
                                    "--kl-loss-type", "low_var_kl", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
                                    "--custom-generate-function-path",
                                    "examples.strands_sglang.generate_with_strands.generate",
                                    "--custom-rm-path", "examples.strands_sglang.generate_with_strands.reward_func")
             if f != "--apply-chat-template"]
    rows, samples = run_example(tmp_path, flags, EXAMPLES / "slime_root")
    assert len(samples) == STEPS * 8
    for s in samples:  # every trained token's version is one the gateway recorded: the step's policy
        assert all(v == s["weight_versions"][0] for v, m in zip(s["weight_versions"], s["loss_mask"]) if m)
    # the example's own attributes, set after its agent ran (kept by lean_rl for its reward function)
    assert all("tool_iters" in s["metadata"]["slime_attributes"] for s in samples)


BUFFER_SERVER = """
import sys
from lean_rl.utils.slime_finder import install_slime_finder
install_slime_finder()  # its generator imports slime.rollout.rm_hub: lean_rl's, in this process too
import uvicorn
uvicorn.run("buffer:app", host="127.0.0.1", port=int(sys.argv[1]), limit_concurrency=1000, timeout_keep_alive=5)
"""


@pytest.fixture
def rollout_buffer_server(tmp_path):
    """slime_plugins/rollout_buffer/buffer.py as it is, served on loopback (its __main__ binds 0.0.0.0,
    which lean_rl's rules forbid: uvicorn is started on 127.0.0.1 instead). It starts the example's
    generator processes (BaseGenerator, 100 of them) when the rollout function posts /start_rollout."""
    port = find_free_port("127.0.0.1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(EXTRA), str(EXAMPLES / "slime_root"),
                                                        os.environ.get("PYTHONPATH", "")])}
    log = open(tmp_path / "buffer_server.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", BUFFER_SERVER, str(port)], env=env, stdout=log, stderr=log,
                            cwd=EXAMPLES / "slime_root" / "slime_plugins" / "rollout_buffer", start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/docs", timeout=2, trust_env=False)
            break
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"the rollout buffer server did not start: {(tmp_path / 'buffer_server.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield f"http://127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGKILL)  # the server and the generator processes it forked (its own session)
    proc.wait()
    log.close()


def test_rollout_buffer_runs_with_its_files_unchanged(tiny_qwen2, tmp_path, example_deps, rollout_buffer_server):
    data = tmp_path / "dapo.jsonl"
    write_rows(data, [{"prompt": [{"role": "user", "content": q}], "label": a} for q, a in QUESTIONS * 2])
    # rollout_buffer_example.sh's flags for its functions (--loss-mask-type for the tiny Qwen2's template), with its
    # --keep-old-actor (a notice: no effect in a synchronous run) and --disable-rewards-normalization (raw rewards);
    # 1 step: the example's generator queues the prompts once and then sleeps 300 s before the next pass,
    # and the example keeps only the newest groups it fetched, so a second step would wait for that pass
    flags = [f for f in slime_flags(tiny_qwen2, data, tmp_path, "--label-key", "label", "--rm-type", "deepscaler",
                                    "--rollout-max-response-len", "24",
                                    "--rollout-function-path",
                                    "slime_plugins.rollout_buffer.rollout_buffer_example.generate_rollout",
                                    "--rollout-buffer-url", rollout_buffer_server, "--loss-mask-type", "qwen",
                                    "--log-passrate", "--keep-old-actor", "--disable-rewards-normalization")
             if f != "--apply-chat-template"]
    flags[flags.index("--num-rollout") + 1] = "1"
    env = {"PYTHONPATH": os.pathsep.join([str(EXAMPLES / "slime_root"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_lean_rl("lean_rl.slime_launch", flags, extra_env=env, timeout_s=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    [row] = read_metrics(tmp_path)
    assert row.get("rollout/failed_samples", 0) == 0, row
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples" / "step_000000.jsonl").read_text().splitlines()]
    assert len(samples) == 8  # --rollout-batch-size 4 groups of --n-samples-per-prompt 2, built by the example
    for s in samples:
        assert s["status"] != "failed", s["metadata"].get("generate_error")
        assert s["metadata"]["slime_attributes"]["index"] in range(len(QUESTIONS) * 2)  # its instance id
        assert isinstance(s["prompt"], str) and len(s["prompt"]) == 36  # the example's prompt: the item's uuid
        trained = [v for v, m in zip(s["weight_versions"], s["loss_mask"]) if m]
        assert trained and set(trained) == {0}  # the gateway's record of the chat answers: version 0
        assert s["reward"] in (0, 1)  # the generator's deepscaler score
