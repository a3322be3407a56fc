"""Where a distributed weight sync's fixed time goes: each piece timed from the driver, round by round.

    .venv/bin/python bench/weight_sync_spans.py [--preset tiny] [--rounds 30]

One Megatron rank and the preset's engines (as bench/weight_sync.py). Per round: a no-op Ray call to
the rank, /begin_weight_update then /end_weight_update on every engine, a bare /get_weight_version on
every engine (an HTTP round trip that runs no weight code), and one delivery (the transport's deliver,
no probe) split by its StageSent into the export, the lead's sending, and the rest (the Ray call and
the lead's end of the session). Medians and quartiles; no floor (bench/weight_sync_ab.py has it).
"""

from __future__ import annotations

import os
import statistics
import time

from bench_common import at_least, bench_parser, parse_bench_args, run_bench, work_dir_with_ray, write_rows
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.options import build
from lean_rl.weight_sync.engine_calls import call_all
from lean_rl.weight_sync.rank import RankWeightSync
from weight_sync import ENGINES

SPANS = ("ray no-op", "begin", "end", "get_weight_version", "delivery", "export", "lead sending", "ray + end")


def main(argv: list[str]) -> int:
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync

    parser = bench_parser("weight_sync_spans", __doc__, {"rounds": 10})
    parser.add_argument("--preset", default="tiny", choices=sorted(ENGINES))
    parser.add_argument("--rounds", type=at_least(2), default=30)
    args = parse_bench_args(parser, argv)
    work = work_dir_with_ray(None, "lean_rl_bench_wsync_spans_")
    served = make_tiny_model(work / "s0", arch="qwen2", seed=0, preset=args.preset)
    trained = make_tiny_model(work / "s1", arch="qwen2", seed=1, preset=args.preset)
    config = engine_config_for_tests(served, "--rollout-num-engines", str(ENGINES[args.preset]))
    cfg = build(WeightSyncConfig, transport="distributed", timeout_s=1800)
    spans: dict[str, list[float]] = {name: [] for name in SPANS}

    def timed(name: str, fn, *fn_args):
        started = time.perf_counter()
        result = fn(*fn_args)
        spans[name].append(time.perf_counter() - started)
        return result

    with EngineGroup(config, work / "engines") as engines, \
            MegatronGroup.from_hf_checkpoint(trained, ParallelConfig(), call_timeout_s=1800) as trainer, \
            WeightSync.create(cfg, trainer, engines.engine_urls, api_key=config.api_key) as sync:
        sync.update(0)
        sync.update(0, probe=False)  # pipelined from here on
        for index in range(args.rounds):
            timed("ray no-op", trainer.call_all, RankWeightSync.close, "no such sync")
            timed("begin", call_all, sync.clients, cfg.timeout_s, EngineClient.begin_weight_update)
            timed("end", call_all, sync.clients, cfg.timeout_s, EngineClient.end_weight_update)
            timed("get_weight_version", call_all, sync.clients, cfg.timeout_s, EngineClient.weight_version)
            sent = timed("delivery", sync.transport.deliver, sync, str(index + 1))
            spans["export"].append(sum(s.export_seconds for s in sent))
            spans["lead sending"].append(sum(s.send_seconds for s in sent))
            spans["ray + end"].append(spans["delivery"][-1] - spans["export"][-1] - spans["lead sending"][-1])
    print(f"\n{args.preset} -> {ENGINES[args.preset]} engine(s), {args.rounds} rounds, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    for name, values in spans.items():
        q = statistics.quantiles(values, n=4)
        print(f"  {name:20} median {statistics.median(values) * 1e3:7.1f} ms  quartiles {q[0] * 1e3:7.1f}..{q[2] * 1e3:7.1f}")
    write_rows(args.json, [])  # a profile, not a row of bench/run_all.py's table
    return 0


if __name__ == "__main__":
    run_bench("weight_sync_spans", main)
