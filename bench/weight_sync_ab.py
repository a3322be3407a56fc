"""Weight sync, distributed transport: the engines' session held by the driver (before) or by the
stage leads (now, weight_sync/engine_session.py), side by side in one run, with the raw TCP floor.

    .venv/bin/python bench/weight_sync_ab.py [--presets tiny base100m] [--rounds 20]

Two WeightSyncs share one Megatron group (one rank, gloo) and the same engines (tiny: 2, base100m: 1,
as bench/weight_sync.py). "before" is DriverSession below: the driver posts /begin_weight_update to
every engine and waits, makes the Ray call to the rank (export, /update_weights_from_distributed,
broadcasts), then posts /end_weight_update; "now" is the transport as shipped: one Ray call, the lead
posts begin while it exports and end after its last bucket. Each round runs before, now and the floor
(bench/weight_sync.Floor: the same bytes over TCP to one receiver per engine), taking every order of
the three in turn, so that a shared machine's drift, and what one arm leaves behind for the next,
hit all three alike. Printed: the medians, the quartiles (the
spread), the median of the per-round ratios now / before, and each arm's median / the floor's median.
The syncs run without the probe; after each round the probe runs apart, both ways in turn: the
trainer's forward and then the engines' scoring (as update() did before), and both at once
(WeightSync.probe, as update() does now when nothing changes hands between them).
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from pathlib import Path

from bench_common import (NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench,
                          work_dir_with_ray, write_rows)
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.options import build
from lean_rl.weight_sync.engine_calls import call_all, submit_all
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.probe import run_probe
from lean_rl.weight_sync.transports.distributed import DistributedTransport
from weight_sync import ENGINES, Floor

QUICK = {"presets": ["tiny", "base100m"], "rounds": 12}
ARMS = ("before", "now", "floor")
# every order of the arms in turn: each arm follows each other arm equally often (a rotation alone
# always ran "now" right after "before", which then paid whatever the engine still did after it)
ORDERS = list(itertools.permutations(ARMS))
# the probe after a sync: the trainer's forward, then the engines' scoring (before), or both at once
PROBES = ("probe, trainer then engines", "probe, both at once")


class DriverSession(DistributedTransport):
    """The distributed transport with the session held by the driver, as it was before
    engine_session.py: begin on every engine (waited for), the stage's Ray call, end on every engine."""

    def deliver(self, sync, version):
        timeout = sync.cfg.timeout_s
        opened, errors = [], []
        for client, (_, future) in zip(sync.clients, submit_all(sync.clients, EngineClient.begin_weight_update)):
            try:
                future.result(timeout=timeout)
                opened.append(client)
            except Exception as exc:
                errors.append(WeightSyncError(f"begin_weight_update: {exc}"))
        try:
            if errors:
                raise errors[0]
            sent = sync.send_stages(lambda stage: (version, stage == sync.num_stages - 1))
        finally:
            call_all(opened, timeout, EngineClient.end_weight_update)
        return sent

    def send_stage(self, rank, export, version, final_stage):
        return self.stream_stage(rank, export, version, final_stage)

    def session_error(self):
        return None  # the driver opened it


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def run_preset(preset: str, rounds: int, work: Path) -> dict[str, list[float]]:
    from safetensors.torch import load_file

    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync

    served = make_tiny_model(work / f"{preset}-s0", arch="qwen2", seed=0, preset=preset)
    trained = make_tiny_model(work / f"{preset}-s1", arch="qwen2", seed=1, preset=preset)
    state_dict = load_file(str(trained / "model.safetensors"))
    engines_n = ENGINES.get(preset, 1)
    config = engine_config_for_tests(served, "--rollout-num-engines", str(engines_n))
    cfg = build(WeightSyncConfig, transport="distributed", timeout_s=1800)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS + PROBES}
    with EngineGroup(config, work / f"engines-{preset}") as engines, \
            MegatronGroup.from_hf_checkpoint(trained, ParallelConfig(), call_timeout_s=1800) as trainer:
        floor = Floor("distributed", state_dict, engines_n, rounds + 1, cfg.buffer_size_bytes, work)
        before = WeightSync(cfg, trainer, engines.engine_urls, api_key=config.api_key)
        before.transport = DriverSession()
        now = WeightSync(cfg, trainer, engines.engine_urls, api_key=config.api_key)
        try:
            for sync in (before, now):
                sync.connect()
                sync.update(0)  # the first sync records the layout; pipelined from the second on
                sync.update(0, probe=False)
            floor.once()
            step = 1
            for index in range(rounds):
                order = ORDERS[index % len(ORDERS)]
                for arm in order:
                    if arm == "floor":
                        times[arm].append(floor.once())
                    else:
                        sync = before if arm == "before" else now
                        times[arm].append(sync.update(step, probe=False).seconds)
                        step += 1
                for arm in PROBES if index % 2 else PROBES[::-1]:
                    started = time.perf_counter()
                    if arm == "probe, trainer then engines":  # as update() did before
                        run_probe(now._trainer_probe_log_probs(), now.clients, now._probe_ids, str(step - 1),
                                  now.tolerance, cfg.timeout_s)
                    else:
                        now.probe(step - 1)
                    times[arm].append(time.perf_counter() - started)
        finally:
            floor.close()
            before.close()
            now.close()
    return times


def main(argv: list[str]) -> int:
    parser = bench_parser("weight_sync_ab", __doc__, QUICK)
    parser.add_argument("--presets", nargs="+", default=["tiny", "base100m"], choices=sorted(ENGINES))
    parser.add_argument("--rounds", type=at_least(2), default=20)
    parser.add_argument("--work-dir", default=None, help="checkpoints and logs (default: a temporary directory)")
    args = parse_bench_args(parser, argv)
    work = work_dir_with_ray(args.work_dir, "lean_rl_bench_wsync_ab_")
    rows = []
    for preset in args.presets:
        load_start = os.getloadavg()[0]
        started = time.monotonic()
        times = run_preset(preset, args.rounds, work)
        print(f"\n{preset} -> {ENGINES.get(preset, 1)} engine(s), distributed, {args.rounds} rounds "
              f"({time.monotonic() - started:.0f} s; load average {load_start:.1f} at start, "
              f"{os.getloadavg()[0]:.1f} at end)")
        floor = statistics.median(times["floor"])
        for arm in ARMS:
            low, high = quartiles(times[arm])
            print(f"  {arm:6} median {statistics.median(times[arm]) * 1e3:8.1f} ms  quartiles {low * 1e3:8.1f}.."
                  f"{high * 1e3:8.1f} ms  / floor median {statistics.median(times[arm]) / floor:5.2f}x")
        for arm in PROBES:
            low, high = quartiles(times[arm])
            print(f"  {arm:28} median {statistics.median(times[arm]) * 1e3:7.1f} ms  quartiles "
                  f"{low * 1e3:7.1f}..{high * 1e3:7.1f} ms")
        ratios = [n / b for n, b in zip(times["now"], times["before"])]
        low, high = quartiles(ratios)
        print(f"  now / before per round: median {statistics.median(ratios):.2f} (quartiles {low:.2f}..{high:.2f}); "
              f"median difference {statistics.median(b - n for n, b in zip(times['now'], times['before'])) * 1e3:.1f} ms")
        rows.append(row(f"weight sync A/B, {preset}, distributed: session held by the lead (now), median of {args.rounds}",
                        f"{statistics.median(times['now']):.3f} s (driver-held: {statistics.median(times['before']):.3f} s)",
                        f"{floor:.3f} s raw TCP send to each engine's receiver, median", statistics.median(times["now"]) / floor,
                        NO_GOAL, command_line("weight_sync_ab", argv), physical=True))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("weight_sync_ab", main)
