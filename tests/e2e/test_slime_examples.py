"""slime's own example files, unchanged (vendored from THUDM/slime at 624b824 under
tests/e2e/slime_examples/, Apache-2.0), trained by lean_rl through `python -m lean_rl.slime_launch
train.py` with the flags of the example's launch script that concern its functions (the model, GPU and
cluster flags are the tiny CPU run's): search-r1 (its local retrieval server stood in for by a loopback
server on the port its file names), retool (its Python tool sandbox as it is) and multi_agent (a
generate that returns many samples, from five solvers, five rewriters and a selector). Each runs 2
steps of the tiny model with real SGLang, router, Megatron and Ray; every sample must train (none
FAILED), with the loss mask and log-probs the example built. retool and multi_agent read slime's `args`
as slime's parser builds it (`args.context_parallel_size`, `args.rollout_max_context_len`: the generated
namespace of issue 38). docs/extending.md "Coming from slime" lists every slime example and what it needs."""

import http.server
import itertools
import json
import os
import threading

import pytest
from conftest import REPO, read_metrics, run_lean_rl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 2
EXAMPLES = REPO / "tests" / "e2e" / "slime_examples"
QUESTIONS = [("What is the capital of France?", "Paris"), ("Who wrote Hamlet?", "Shakespeare"),
             ("What is 2+3?", "5"), ("What colour is the sky?", "blue")]


def slime_flags(model, data, out, *extra) -> list[str]:
    return ["train.py", "--hf-checkpoint", str(model), "--output-dir", str(out / "run"), "--no-tensorboard",
            "--prompt-data", str(data), "--input-key", "prompt", "--apply-chat-template", "--rollout-shuffle",
            "--num-rollout", str(STEPS), "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
            "--rollout-temperature", "1", "--global-batch-size", "8", "--advantage-estimator", "grpo",
            "--use-kl-loss", "--kl-loss-coef", "0.00", "--optimizer", "adam", "--lr", "1e-5",
            "--lr-decay-style", "constant", "--rollout-num-engines", "1", "--sglang-max-total-tokens", "8192",
            "--colocate", "--dump-samples-interval", "1", *extra]


def run_example(out, flags, path_entry) -> tuple[list[dict], list[dict]]:
    env = {"PYTHONPATH": os.pathsep.join([str(path_entry), str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_lean_rl("lean_rl.slime_launch", flags, extra_env=env, timeout_s=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r.get("rollout/generate_failed", 0) == 0 and r.get("rollout/reward_failed", 0) == 0 for r in rows), rows
    samples = [json.loads(line) for step in range(STEPS)
               for line in (out / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    for s in samples:
        assert s["status"] != "failed", s["metadata"].get("generate_error")
        assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == s["response_length"] > 0
    return rows, samples


def write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


class _Retrieval(http.server.BaseHTTPRequestHandler):
    """search-r1's local retrieval server's /retrieve: {"queries", "topk"} -> {"result": [[{"contents"}]]}."""
    queries: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Retrieval.queries.extend(body["queries"])
        docs = [{"contents": f'"Doc {i}"\nabout {body["queries"][0][:40]}'} for i in range(body["topk"])]
        payload = json.dumps({"result": [docs]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def retrieval_server():
    # generate_with_search.py names http://127.0.0.1:8000/retrieve in its SEARCH_R1_CONFIGS
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), _Retrieval)
    except OSError as err:
        pytest.fail(f"port 8000, which slime's search-r1 example hard-codes for its retrieval server, is taken: {err}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield _Retrieval
    server.shutdown()
    server.server_close()


def test_search_r1_runs_unchanged(tiny_qwen2, tmp_path, retrieval_server):
    data = tmp_path / "nq.jsonl"
    write_rows(data, [{"prompt": [{"role": "user", "content": f"Answer the question. Search with <search> query "
                                                             f"</search> if needed. Question: {q}"}],
                       "reward_model": {"ground_truth": {"target": [a]}}} for q, a in QUESTIONS])
    # run_qwen2.5_3B.sh's rollout flags; --rollout-stop "e" ends the tiny model's turns early, so that
    # the example's second turn (its observation as tool tokens, then the model again) is reached
    flags = slime_flags(tiny_qwen2, data, tmp_path, "--label-key", "reward_model", "--rollout-max-response-len", "24",
                        "--rollout-stop", "e",
                        "--custom-generate-function-path", "generate_with_search.generate",
                        "--custom-rm-path", "generate_with_search.reward_func")
    rows, samples = run_example(tmp_path, flags, EXAMPLES / "search-r1")
    assert len(samples) == STEPS * 8
    two_turns = [s for s in samples if 0 in s["loss_mask"]]
    assert two_turns, "no sample reached the example's second turn"
    for s in two_turns:  # model, observation (not trained), model, and its observation unless it ran out
        mask = s["loss_mask"]
        assert [k for k, _ in itertools.groupby(mask)] in ([1, 0, 1], [1, 0, 1, 0]), mask
        assert all(v == -1 for v, m in zip(s["weight_versions"], mask) if not m)
        assert all(v in (0, 1) for v, m in zip(s["weight_versions"], mask) if m)  # the step's policy version
    assert all(s["reward"] in (0.0, 0.2, 1.0) for s in samples)  # compute_score_em's scores (format_score 0.2)


def test_retool_runs_unchanged(tiny_qwen2, tmp_path):
    data = tmp_path / "dapo.jsonl"
    write_rows(data, [{"prompt": [{"role": "user", "content": q}], "label": a} for q, a in QUESTIONS])
    # retool_qwen3_4b_rl.sh's flags for its functions: the context bound comes from
    # --context-parallel-size x --max-tokens-per-gpu, as slime derives it
    flags = slime_flags(tiny_qwen2, data, tmp_path, "--label-key", "label", "--reward-key", "score",
                        "--rollout-max-response-len", "24", "--rollout-stop", "e",
                        "--context-parallel-size", "1", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "1024",
                        "--custom-generate-function-path", "generate_with_retool.generate",
                        "--custom-rm-path", "generate_with_retool.reward_func")
    rows, samples = run_example(tmp_path, flags, EXAMPLES / "retool")
    assert len(samples) == STEPS * 8
    # the example keeps a reference to sample.loss_mask across turns and assigns it back at the end
    assert any(0 in s["loss_mask"] for s in samples), "no sample reached the example's second turn"
    assert all(s["reward"] <= 1.0 for s in samples)  # math_dapo's score, shaped by the tool-call count


def test_multi_agent_runs_unchanged(tiny_qwen2, tmp_path):
    data = tmp_path / "dapo.jsonl"
    write_rows(data, [{"prompt": [{"role": "user", "content": q}], "label": a} for q, a in QUESTIONS])
    # run-qwen3-30B-A3B-multi-agent.sh's flags for its functions
    flags = slime_flags(tiny_qwen2, data, tmp_path, "--label-key", "label", "--rm-type", "deepscaler",
                        "--rollout-max-context-len", "1024", "--rollout-max-response-len", "16",
                        "--use-rollout-logprobs",
                        "--custom-generate-function-path",
                        "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents")
    rows, samples = run_example(tmp_path, flags, EXAMPLES / "slime_root")
    # each generate call returns the solvers' samples (5), and the rewriters' and selector's when reached
    assert len(samples) >= STEPS * 8 * 5
    assert all(s["metadata"]["slime_attributes"].get("rollout_id") is not None for s in samples)
