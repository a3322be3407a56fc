"""Rollout throughput: lean_rl's rollout path vs raw concurrent /generate calls, same servers, one run.

    .venv/bin/python bench/rollout_throughput.py [--num-engines 2] [--prompts 64] [--samples 4]
                                                 [--max-new-tokens 128] [--concurrency 64] [--rounds 5]
                                                 [--preset tiny | --hf-checkpoint DIR]

Both sides send the same prompts with the same sampling parameters (ignore_eos, so every request makes
exactly --max-new-tokens tokens) through the same sglang-router at the same concurrency. Ours is the
whole default rollout: buffer hand-out, per-sample requests with log-probs, decoding, rewards, groups
back into the buffer. The floor is the same requests (the same bodies, request ids included) posted bare
through httpx connection pools shaped like ours (as many, the same limits), each answer read as JSON: what any rollout over
HTTP must at least do.

Measurement: rounds come in pairs (ours and the floor back to back, the order alternating from pair to
pair: ours-floor, floor-ours, ...) so that drift of a shared machine hits both sides of a pair alike.
The ratio is the median over pairs of ours' time / the floor's time in that pair; its noise is the
spread of those per-pair ratios (half the distance between their quartiles), printed beside it. A
ratio below 1 by less than that is a tie. A second row: the client's own CPU time per request (this
process's CPU seconds in a round / requests) for both sides, as the same median of per-pair ratios
with its spread: on a machine whose cores the engines share, every CPU second the client spends is
taken from generation, and it is far less noisy than wall time. As in a run (run_loop.run), the start-up
heap is frozen before the first round (utils/gc_heap.py: a round that drew a full collection of the
unfrozen heap spent 0.30 s in it, 2.3 ms a request, and such rounds were the pairs' outliers), and ours'
buffer is built before its round's clocks start (a run reads and renders its prompts once). Every round
of either side starts after a collection: the garbage of the round before (an event loop and its pools,
whichever side made them) and the young objects of ours' new buffer are then nobody's round's cost
(measured: 2-4 ms of a 128-request round, charged to whichever side's allocations set off the
collection; in a run the buffer is old and the loop and pools live as long as the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench_common import at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.extensions import install as install_hooks
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.engine_http import pool_limits, tls_context
from lean_rl.backends.sglang.engines import EngineGroup
from lean_rl.backends.sglang.responses import build_generate_payload
from lean_rl.buffer.data_buffer import create_data_buffer
from lean_rl.config import parse_config
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.preflight import check_model_dir
from lean_rl.rollout.base import router_client
from lean_rl.rollout.default import generate_rollout
from lean_rl.testing.sglang_engines import engine_config_for_tests
from lean_rl.testing.tiny_model import PRESETS, make_tiny_model
from lean_rl.utils.gc_heap import freeze_startup_heap

GOAL = 1.1  # ours' time / the floor's
CPU_GOAL = 1.1  # ours' client CPU per request / the floor's
QUICK = {"prompts": 32, "max_new_tokens": 64, "rounds": 12}
WORDS = "the cat dog sat on mat ran fast big small red blue green hello world one two three".split()


def write_prompts(path: Path, n: int) -> Path:
    rows = [{"prompt": " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(6 + i % 5)), "label": "x"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def floor_round(router_url: str, prompts: list[list[int]], samples: int, params: dict, concurrency: int,
                      headers: dict[str, str]) -> tuple[float, int]:
    """The floor: the same /generate requests (body as ours sends it, log-probs and a request id included)
    posted at the same concurrency through httpx connection pools shaped like ours (EngineClient's:
    as many pools, the same limits, taken in turn), with the run's auth `headers`, each answer read as
    JSON. (seconds, output tokens)."""
    semaphore = asyncio.Semaphore(concurrency)
    async with contextlib.AsyncExitStack() as stack:
        pools = [await stack.enter_async_context(httpx.AsyncClient(base_url=router_url, timeout=600, limits=limits,
                                                                   trust_env=False, headers=headers,
                                                                   verify=tls_context()))
                 for limits in pool_limits(EngineClient.max_connections, EngineClient.max_keepalive_connections,
                                           EngineClient.pool_shards)]

        async def one(number, ids):
            async with semaphore:
                body = build_generate_payload(ids, params, return_logprob=True, rid=f"floor-{number}")
                reply = await pools[number % len(pools)].post("/generate", json=body)
                reply.raise_for_status()
                return reply.json()["meta_info"]["completion_tokens"]

        started = time.monotonic()
        requests = [ids for ids in prompts for _ in range(samples)]
        tokens = await asyncio.gather(*(one(number, ids) for number, ids in enumerate(requests)))
        return time.monotonic() - started, sum(tokens)


@dataclasses.dataclass(frozen=True)
class PairRatios:
    """ours / floor per interleaved pair: their median, quartiles (low, high) and noise (half the
    distance between the quartiles: a ratio within it of another is a tie)."""

    ratios: tuple[float, ...]
    median: float
    low: float
    high: float

    @property
    def noise(self) -> float:
        return (self.high - self.low) / 2

    def describe(self) -> str:
        return (f"median of pairs {self.median:.3f} (quartiles {self.low:.3f}..{self.high:.3f}, "
                f"all {min(self.ratios):.3f}..{max(self.ratios):.3f})")


def pair_ratios(ours: list[float], floor: list[float]) -> PairRatios:
    """ours[i] / floor[i] for each pair i (both measured back to back, so drift hits both alike)."""
    if not ours or len(ours) != len(floor):
        raise ValueError(f"pair_ratios: {len(ours)} rounds of ours, {len(floor)} of the floor (one each per pair)")
    ratios = tuple(o / f for o, f in zip(ours, floor))
    median = statistics.median(ratios)
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (median, median, median)
    return PairRatios(ratios, median, low, high)


async def ours_round(cfg, buffer) -> tuple[float, int]:
    started = time.monotonic()
    await generate_rollout(cfg, 0, buffer)
    seconds = time.monotonic() - started
    tokens = sum(s.response_length for g in buffer.get_train_groups(10**6) for s in g)
    # its pools closed in its round, as the floor closes its own (a run's live as long as its loop)
    await router_client(cfg).aclose()
    return seconds, tokens


def main(argv: list[str]) -> int:
    parser = bench_parser("rollout_throughput", __doc__, QUICK)
    parser.add_argument("--num-engines", type=at_least(1), default=2)
    parser.add_argument("--prompts", type=at_least(1), default=64)
    parser.add_argument("--samples", type=at_least(1), default=4)
    parser.add_argument("--max-new-tokens", type=at_least(1), default=128)
    parser.add_argument("--concurrency", type=at_least(1), default=64)
    parser.add_argument("--rounds", type=at_least(1), default=10, help="pairs of rounds (ours + floor each)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="tiny-model preset")
    parser.add_argument("--hf-checkpoint", metavar="DIR", help="serve this HF model instead of a tiny one")
    args = parse_bench_args(parser, argv)
    if args.hf_checkpoint:
        check_model_dir(args.hf_checkpoint, "--hf-checkpoint")

    work = Path(tempfile.mkdtemp(prefix="lean_rl_bench_rollout_"))
    model = Path(args.hf_checkpoint) if args.hf_checkpoint else make_tiny_model(work / "model", preset=args.preset)
    prompts_path = write_prompts(work / "prompts.jsonl", args.prompts)
    engines_cfg = engine_config_for_tests(model, "--rollout-num-engines", str(args.num_engines))
    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(prompts_path),
                        "--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(args.samples),
                        "--rollout-max-response-len", str(args.max_new_tokens), "--rollout-ignore-eos",
                        "--rollout-max-concurrency", str(args.concurrency), "--rm-type", "exact"])
    cfg = dataclasses.replace(cfg, engines=engines_cfg)
    install_hooks(cfg)  # what a run does at start-up
    tokenizer = load_tokenizer(str(model))
    prompt_ids = [tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"]
                  for line in prompts_path.read_text().splitlines()]
    params = cfg.rollout.sampling.to_sglang()

    expected = args.prompts * args.samples * args.max_new_tokens
    seconds: dict[str, list[float]] = {"ours": [], "floor": []}
    cpu: dict[str, list[float]] = {"ours": [], "floor": []}  # this process's CPU seconds per request
    with EngineGroup(engines_cfg, work / "engines") as engines:
        headers = engines_cfg.auth_headers()
        asyncio.run(floor_round(engines.router_url, prompt_ids[:4], 1, params, args.concurrency, headers))  # warm-up
        freeze_startup_heap()  # as run_loop.run does once a run has started
        asyncio.run(ours_round(cfg, create_data_buffer(cfg)))  # warm-up: first-use imports and caches of ours
        for pair in range(args.rounds):
            for name in ("ours", "floor") if pair % 2 == 0 else ("floor", "ours"):
                # a run builds its buffer (prompts read and rendered) once, at start-up, not per rollout
                buffer = create_data_buffer(cfg) if name == "ours" else None
                # each round starts with no garbage: the previous round's (the other side's event loop and
                # pools) and ours' freshly built buffer would otherwise be walked by whichever side's
                # allocations next trigger a collection (a run's buffer is old by its first rollout)
                gc.collect()
                cpu_started = time.process_time()
                if name == "ours":
                    wall, tokens = asyncio.run(ours_round(cfg, buffer))
                else:
                    wall, tokens = asyncio.run(floor_round(engines.router_url, prompt_ids, args.samples,
                                                           params, args.concurrency, headers))
                cpu[name].append((time.process_time() - cpu_started) / (args.prompts * args.samples))
                if tokens != expected:
                    raise RuntimeError(f"{name}: {tokens} tokens generated, expected {expected}")
                seconds[name].append(wall)
                print(f"{name:5s} {tokens} tokens in {wall:6.2f} s = {tokens / wall:7.1f} tok/s, "
                      f"client CPU {cpu[name][-1] * 1e3:.2f} ms/request", flush=True)
    wall = pair_ratios(seconds["ours"], seconds["floor"])
    used = pair_ratios(cpu["ours"], cpu["floor"])
    ours, floor = expected / statistics.median(seconds["ours"]), expected / statistics.median(seconds["floor"])
    ours_cpu, floor_cpu = statistics.median(cpu["ours"]) * 1e3, statistics.median(cpu["floor"]) * 1e3
    print(f"\nrollout throughput ({args.num_engines} engines, {args.prompts}x{args.samples} requests x "
          f"{args.max_new_tokens} tokens, concurrency {args.concurrency}, {args.rounds} pairs of rounds):")
    print(f"  ours  {ours:8.1f} tok/s (median), client CPU {ours_cpu:.2f} ms/request\n"
          f"  floor {floor:8.1f} tok/s (median), client CPU {floor_cpu:.2f} ms/request\n"
          f"  ours / floor time, {wall.describe()}; goal <= {GOAL}\n"
          f"  ours / floor client CPU per request, {used.describe()}; goal <= {CPU_GOAL}")
    model_name = model.name if args.hf_checkpoint else args.preset
    setup = (f"{model_name}, {args.num_engines} engines, {args.prompts}×{args.samples} requests × "
             f"{args.max_new_tokens} tokens, concurrency {args.concurrency}, median of {args.rounds} interleaved "
             f"pairs of rounds; spread: half the quartile distance of the pairs' ratios")
    command = command_line("rollout_throughput", argv)
    write_rows(args.json, [
        row(f"rollout time, ours / the same `/generate` requests through connection pools shaped like ours "
            f"({setup})",
            f"{ours:.0f} tok/s, client CPU {ours_cpu:.2f} ms/request",
            f"{floor:.0f} tok/s, client CPU {floor_cpu:.2f} ms/request: the same requests, bare; pairs' ratios "
            f"{wall.low:.3f}..{wall.high:.3f} (quartiles)",
            wall.median, f"<= {GOAL}", command, physical=True, noise=wall.noise),
        # not physical: a client leaner than httpx's bare loop may use less CPU than this floor
        row(f"rollout client CPU per request, ours / the same requests bare (this process's CPU seconds per "
            f"round / requests; the engines share the cores, so every client ms is taken from generation; {setup})",
            f"{ours_cpu:.2f} ms/request", f"{floor_cpu:.2f} ms/request: the same requests, bare; pairs' ratios "
            f"{used.low:.3f}..{used.high:.3f} (quartiles)",
            used.median, f"<= {CPU_GOAL}", command, noise=used.noise)])
    return 0


if __name__ == "__main__":
    run_bench("rollout_throughput", main)
