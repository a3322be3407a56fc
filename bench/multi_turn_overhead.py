"""Multi-turn rollout overhead: lean_rl's multi-turn generate vs bare /generate calls, same servers, one run.

    .venv/bin/python bench/multi_turn_overhead.py [--num-engines 2] [--trajectories 32] [--turns 4]
                                                  [--tokens-per-turn 32] [--rounds 3] [--hf-checkpoint DIR]

Ours: a rollout of --trajectories samples, each --turns model turns of exactly --tokens-per-turn tokens
(ignore_eos) with an instant environment whose observation is a fixed chat message: the whole
machinery (buffer, per-turn requests with log-probs, observation rendering, session affinity,
per-token bookkeeping). Two floors, bare httpx posts through the same router at the same
concurrency:
  replay  - the same turns, in order within each trajectory (same growing prompts)
  single  - the same number of calls, all independent single-turn calls of the first prompt
Every round starts with the engines' prefix caches flushed. Rounds alternate so drift of a shared
machine hits all three; ratios are of the median rounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.extensions import install as install_hooks
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.config import parse_config
from lean_rl.preflight import check_model_dir
from lean_rl.rollout.default import generate_rollout
from lean_rl.testing.sglang_engines import engine_config_for_tests
from lean_rl.testing.tiny_model import make_tiny_model

QUICK = {"trajectories": 32, "turns": 3, "tokens_per_turn": 32, "rounds": 3}
ENV_MODULE = '''
from lean_rl.rollout.environment import Observation

class Fixed:
    turns = {turns}
    def __init__(self, cfg, sample):
        self.turn = 0
    async def reset(self, sample):
        return None
    async def step(self, action):
        self.turn += 1
        return Observation(text="ok, go on", role="user"), 0.0, self.turn == self.turns
'''


async def ours_round(cfg) -> tuple[float, int, list]:
    buffer = create_data_buffer(cfg)
    started = time.monotonic()
    await generate_rollout(cfg, 0, buffer)
    seconds = time.monotonic() - started
    samples = [s for g in buffer.get_train_groups(10**6) for s in g]
    return seconds, sum(sum(s.loss_mask) for s in samples), samples


async def floor_round(router_url: str, trajectories: list[list[list[int]]], params: dict, concurrency: int,
                      headers: dict[str, str], replay: bool) -> tuple[float, int]:
    """Bare posts: each trajectory's turns in order (replay), or every call on the first prompt at once."""
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=router_url, timeout=600, limits=limits, trust_env=False,
                                 headers=headers) as http:
        async def call(ids):
            async with semaphore:
                reply = await http.post("/generate", json={"input_ids": ids, "sampling_params": params,
                                                           "return_logprob": True})
                reply.raise_for_status()
                return reply.json()["meta_info"]["completion_tokens"]

        async def trajectory(inputs):
            return [await call(ids) for ids in inputs]

        started = time.monotonic()
        if replay:
            tokens = [t for ts in await asyncio.gather(*(trajectory(t) for t in trajectories)) for t in ts]
        else:
            tokens = await asyncio.gather(*(call(t[0]) for t in trajectories for _ in t))
        return time.monotonic() - started, sum(tokens)


async def flush_caches(engines_cfg) -> None:
    for url in engines_cfg.engine_urls:
        async with EngineClient(url, api_key=engines_cfg.api_key) as client:
            await client.flush_cache()


def main(argv: list[str]) -> int:
    parser = bench_parser("multi_turn_overhead", __doc__, QUICK)
    parser.add_argument("--num-engines", type=at_least(1), default=2)
    parser.add_argument("--trajectories", type=at_least(1), default=32)
    parser.add_argument("--turns", type=at_least(1), default=4)
    parser.add_argument("--tokens-per-turn", type=at_least(1), default=32)
    parser.add_argument("--concurrency", type=at_least(1), default=64)
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--hf-checkpoint", metavar="DIR", help="serve this HF model (with a chat template) "
                        "instead of the tiny one")
    args = parse_bench_args(parser, argv)
    if args.hf_checkpoint:
        check_model_dir(args.hf_checkpoint, "--hf-checkpoint")

    work = Path(tempfile.mkdtemp(prefix="lean_rl_bench_multi_turn_"))
    model = Path(args.hf_checkpoint) if args.hf_checkpoint else make_tiny_model(work / "model")
    (work / "bench_env.py").write_text(ENV_MODULE.format(turns=args.turns))
    sys.path.insert(0, str(work))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}: the cat sat", "label": "x"}) + "\n"
                               for i in range(args.trajectories)))
    engines_cfg = engine_config_for_tests(model, "--rollout-num-engines", str(args.num_engines))
    budget = args.turns * (args.tokens_per_turn + 32)
    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--apply-chat-template",
                        "--rollout-batch-size", str(args.trajectories), "--n-samples-per-prompt", "1",
                        "--rollout-max-response-len", str(budget), "--max-tokens-per-turn", str(args.tokens_per_turn),
                        "--rollout-ignore-eos", "--rollout-max-concurrency", str(args.concurrency),
                        "--environment-path", "bench_env.Fixed", "--max-turns", str(args.turns)])
    cfg = dataclasses.replace(cfg, engines=engines_cfg)
    install_hooks(cfg)  # what a run does at start-up
    params = {**cfg.rollout.sampling.to_sglang(), "max_new_tokens": args.tokens_per_turn}
    expected = args.trajectories * args.turns * args.tokens_per_turn

    results: dict[str, list[float]] = {"ours": [], "replay": [], "single": []}
    with EngineGroup(engines_cfg, work / "engines") as engines:
        headers = engines_cfg.auth_headers()
        _, _, samples = asyncio.run(ours_round(cfg))  # warm-up, and the turn inputs the floors replay
        trajectories = [[s.tokens[:t["input_tokens"]] for t in s.metadata["turns"]] for s in samples]
        for _ in range(args.rounds):
            for name in results:
                asyncio.run(flush_caches(engines.config))  # no side starts with the other's prefixes cached
                if name == "ours":
                    seconds, tokens, _ = asyncio.run(ours_round(cfg))
                else:
                    seconds, tokens = asyncio.run(floor_round(engines.router_url, trajectories, params,
                                                              args.concurrency, headers, replay=name == "replay"))
                if tokens != expected:
                    raise RuntimeError(f"{name}: {tokens} model tokens, expected {expected}")
                results[name].append(tokens / seconds)
                print(f"{name:6s} {tokens} tokens in {seconds:6.2f} s = {tokens / seconds:7.1f} tok/s", flush=True)
    ours, replay, single = (statistics.median(results[k]) for k in ("ours", "replay", "single"))
    print(f"\nmulti-turn rollout ({args.num_engines} engines, {args.trajectories} trajectories x {args.turns} turns "
          f"x {args.tokens_per_turn} tokens, concurrency {args.concurrency}, median of {args.rounds}):")
    print(f"  ours    {ours:8.1f} tok/s\n  replay  {replay:8.1f} tok/s   ours/replay {ours / replay:6.3f}"
          f"  (our machinery's overhead)\n  single  {single:8.1f} tok/s   ours/single {ours / single:6.3f}"
          f"  (vs as many independent single-turn calls)")
    workload = (f"{model.name if args.hf_checkpoint else 'tiny'}, {args.trajectories} trajectories × {args.turns} "
                f"turns × {args.tokens_per_turn} tokens, {args.num_engines} engines, caches flushed per round, "
                f"median of {args.rounds}")
    command = command_line("multi_turn_overhead", argv)
    write_rows(args.json, [
        row(f"multi-turn rollout, ours / the same turns as bare `/generate` posts ({workload})", f"{ours:.0f} tok/s",
            f"{replay:.0f} tok/s replayed turns", ours / replay, NO_GOAL, command),
        row(f"multi-turn rollout, ours / as many independent single-turn calls ({workload})", f"{ours:.0f} tok/s",
            f"{single:.0f} tok/s single-turn calls", ours / single, NO_GOAL, command)])
    return 0


if __name__ == "__main__":
    run_bench("multi_turn_overhead", main)
