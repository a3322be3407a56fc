"""Added latency of the OpenAI capture endpoint: the same chat request through the capture endpoint vs
the same ids straight to the router's /generate, one call at a time, same servers, one run.

    .venv/bin/python bench/capture_latency.py [--calls 50] [--rounds 3] [--max-new-tokens 16] [--turns 1]
                                              [--preset tiny | --hf-checkpoint DIR]

Both sides generate exactly --max-new-tokens tokens (ignore_eos) from the same prompt ids with log-probs.
`direct` posts the ids with httpx; `capture/httpx` posts the chat request to the capture endpoint with
httpx (render, tokenize, /generate, record, answer); `capture/openai` is the same through the `openai`
client, as an agent sends it. --turns N makes each call the N-th turn of a conversation (the
history grows, which is what rendering and prefix matching pay for). Rounds alternate the three so
that drift of a shared machine hits all; figures are medians over all calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import openai

from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.config import parse_config
from lean_rl.preflight import check_model_dir
from lean_rl.rollout.openai_capture import CaptureSession, stop_capture_servers
from lean_rl.sample import Sample
from lean_rl.testing.sglang_engines import engine_config_for_tests
from lean_rl.testing.tiny_model import PRESETS, make_tiny_model

QUICK = {"calls": 20, "rounds": 3}


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "you are a helpful assistant"}]
    for t in range(turns - 1):
        messages += [{"role": "user", "content": f"question {t}: the cat sat on the mat"},
                     {"role": "assistant", "content": f"answer {t}: the dog ran fast and the cat sat"}]
    return messages + [{"role": "user", "content": "last question: what is red and blue"}]


async def one_round(cfg, router_url: str, headers: dict, calls: int, max_new: int, messages: list[dict],
                    which: str) -> list[float]:
    """Seconds per call of one side, and the capture endpoint's own seconds per call (its record)."""
    sample = Sample(index=0, group_index=0, prompt="bench", tokens=[1])
    params = cfg.rollout.sampling.to_sglang()
    request = {"model": "policy", "messages": messages, "max_tokens": max_new}
    seconds, in_endpoint = [], []
    async with CaptureSession(cfg, sample, params) as session, \
            httpx.AsyncClient(timeout=600, trust_env=False) as http, \
            openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0) as client:
        # the prompt ids the capture endpoint renders, for the direct side
        reply = await http.post(f"{session.base_url}/chat/completions", json=request,
                                headers={"Authorization": f"Bearer {session.api_key}"})
        reply.raise_for_status()
        first = session.samples()[0]
        prompt_ids = first.tokens[:first.prompt_length]
        for _ in range(calls):
            started = time.perf_counter()
            if which == "direct":
                reply = await http.post(f"{router_url}/generate", headers=headers, json={
                    "input_ids": prompt_ids, "sampling_params": {**params, "max_new_tokens": max_new},
                    "return_logprob": True})
                reply.raise_for_status()
                produced = len(reply.json()["output_ids"])
            elif which == "capture/httpx":
                reply = await http.post(f"{session.base_url}/chat/completions", json=request,
                                        headers={"Authorization": f"Bearer {session.api_key}"})
                reply.raise_for_status()
                produced = reply.json()["usage"]["completion_tokens"]
            else:
                answer = await client.chat.completions.create(**request)
                produced = answer.usage.completion_tokens
            seconds.append(time.perf_counter() - started)
            if produced != max_new:
                raise RuntimeError(f"{which}: {produced} tokens generated, expected {max_new}")
        if which != "direct":  # the endpoint's own time per call (the engine call excluded), as recorded
            in_endpoint = [c["capture_seconds"] for s in session.samples() for c in s.metadata["capture_calls"]]
    await stop_capture_servers()
    return seconds, in_endpoint


def main(argv: list[str]) -> int:
    parser = bench_parser("capture_latency", __doc__, QUICK)
    parser.add_argument("--calls", type=at_least(2), default=50, help="sequential calls per side and round")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--max-new-tokens", type=at_least(1), default=16)
    parser.add_argument("--turns", type=at_least(1), default=1, help="each call is this turn of a conversation")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="tiny-model preset")
    parser.add_argument("--hf-checkpoint", metavar="DIR", help="serve this HF model (with a chat template) "
                        "instead of a tiny one")
    args = parse_bench_args(parser, argv)
    if args.hf_checkpoint:
        check_model_dir(args.hf_checkpoint, "--hf-checkpoint")

    work = Path(tempfile.mkdtemp(prefix="lean_rl_bench_capture_"))
    model = Path(args.hf_checkpoint) if args.hf_checkpoint else make_tiny_model(work / "model", preset=args.preset)
    prompts = work / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "x", "label": "x"}) + "\n")
    engines_cfg = engine_config_for_tests(model, "--rollout-num-engines", "1")
    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--rollout-ignore-eos",
                        "--rollout-max-response-len", str(args.max_new_tokens)])
    cfg = dataclasses.replace(cfg, engines=engines_cfg)
    messages = conversation(args.turns)
    sides = ("direct", "capture/httpx", "capture/openai")
    results: dict[str, list[float]] = {side: [] for side in sides}
    in_endpoint: list[float] = []
    with EngineGroup(engines_cfg, work / "engines") as engines:
        cfg = dataclasses.replace(cfg, engines=engines.config)
        headers = engines_cfg.auth_headers()
        for side in sides:  # warm-up: connections, the prefix cache, the tokenizer
            asyncio.run(one_round(cfg, engines.router_url, headers, 3, args.max_new_tokens, messages, side))
        for r in range(args.rounds):
            for side in sides:
                seconds, inside = asyncio.run(one_round(cfg, engines.router_url, headers, args.calls,
                                                        args.max_new_tokens, messages, side))
                results[side] += seconds
                in_endpoint += inside
                print(f"round {r} {side:15s} median {statistics.median(seconds) * 1e3:7.2f} ms/call", flush=True)
    direct = statistics.median(results["direct"])
    workload = (f"{model.name if args.hf_checkpoint else args.preset}, {args.max_new_tokens} new tokens, "
                f"turn {args.turns}, {args.calls}×{args.rounds} sequential calls per side, medians")
    command = command_line("capture_latency", argv)
    rows = []
    print(f"\ncapture endpoint latency ({args.calls} x {args.rounds} sequential calls per side, "
          f"{args.max_new_tokens} new tokens, turn {args.turns} of a conversation, medians):")
    for side in sides:
        median = statistics.median(results[side])
        print(f"  {side:15s} {median * 1e3:8.2f} ms/call   added {(median - direct) * 1e3:+7.2f} ms   "
              f"ratio {median / direct:6.3f}")
        if side != "direct":
            rows.append(row(f"OpenAI capture endpoint ({side}) / a direct `/generate`, per chat completion ({workload})",
                            f"{median * 1e3:.1f} ms ({(median - direct) * 1e3:+.1f} ms)",
                            f"{direct * 1e3:.1f} ms direct `/generate`", median / direct, NO_GOAL, command))
    inside, inside_p95 = statistics.median(in_endpoint), statistics.quantiles(in_endpoint, n=20)[-1]
    print(f"  in the endpoint (render, tokenize, record, answer; engine call excluded): "
          f"{inside * 1e3:.2f} ms/call median, {inside_p95 * 1e3:.2f} ms p95")
    rows.append(row(f"OpenAI capture endpoint, its own time per call (render, tokenize, record, answer; "
                    f"engine call excluded; {workload})", f"{inside * 1e3:.2f} ms median, {inside_p95 * 1e3:.2f} ms p95",
                    "—", None, NO_GOAL, command))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("capture_latency", main)
