"""Weight sync: seconds per sync for each transport vs its floor measured in the same run, as a ratio.

    .venv/bin/python bench/weight_sync.py [--presets tiny base100m] [--rounds 3]
                                          [--transports distributed tensor disk] [--buffer-size BYTES]

A Megatron group (one rank, gloo) loads a tiny-model checkpoint (seed 1) and syncs it to SGLang
engines serving the seed-0 checkpoint of the same preset (tiny: 2 engines, base100m: 1 engine). Ours
is SyncReport.seconds: from the start of update() until every engine holds the weights (export from
Megatron, buckets, HTTP, engine load; the probe that follows is reported apart). Floors, on the same
bytes (the HF state dict in the sync dtype), in the same run:
- distributed: one raw gloo broadcast of all the bytes from one process to as many receiver processes
  as there are engines, then a barrier (so that every receiver has them);
- disk: safetensors save_file of the state dict, then load_file;
- tensor (CPU): the inline payload's own cost, pickle + base64 of every bucket and back (on GPU the
  transport sends CUDA IPC handles instead; not measured here).
Rounds alternate ours and floor so that drift of a shared machine hits both; medians are compared.
`export` is the part of ours spent gathering HF tensors from the Megatron shards.
"""

from __future__ import annotations

import base64
import datetime
import multiprocessing
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench_common import at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from lean_rl.options import ConfigError, build
from lean_rl.weight_sync.buckets import iter_buckets

ENGINES = {"tiny": 2, "small": 2, "base100m": 1}
TRANSPORTS = ("distributed", "tensor", "disk")
QUICK = {"presets": ["base100m"], "rounds": 2}
GOAL = 1.5  # ours / floor


# ------------------------------------------------------------------ floors
def _receiver(port: int, rank: int, world_size: int, nbytes: int, rounds: int) -> None:
    import torch.distributed as dist

    from lean_rl.weight_sync.process_group import join_group

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=datetime.timedelta(seconds=300))
    pg = join_group(store, world_size, rank, "floor", "gloo", 300)
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    for _ in range(rounds):
        dist.broadcast(buffer, group=pg, group_src=0)
        dist.barrier(group=pg)
    dist.destroy_process_group(pg)  # gloo's threads must be joined before the interpreter exits


class BroadcastFloor:
    """Receiver processes that stay up for all rounds; `once()` times one broadcast + barrier."""

    def __init__(self, nbytes: int, receivers: int, rounds: int):
        import torch.distributed as dist

        from lean_rl.weight_sync.process_group import join_as_rank_zero, open_group_store

        self.dist = dist
        world_size = 1 + receivers
        store, port = open_group_store(world_size, 300)
        context = multiprocessing.get_context("spawn")
        self.procs = [context.Process(target=_receiver, args=(port, r, world_size, nbytes, rounds), daemon=True)
                      for r in range(1, world_size)]
        for proc in self.procs:
            proc.start()
        self.pg = join_as_rank_zero(store, world_size, "floor", "gloo", 300)
        self._store = store
        self.buffer = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)

    def once(self) -> float:
        started = time.perf_counter()
        self.dist.broadcast(self.buffer, group=self.pg, group_src=0)
        self.dist.barrier(group=self.pg)
        return time.perf_counter() - started

    def close(self) -> None:
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
        self.dist.destroy_process_group(self.pg)


def disk_floor(state_dict: dict[str, torch.Tensor], directory: Path) -> float:
    from safetensors.torch import load_file, save_file

    path = directory / "floor.safetensors"
    started = time.perf_counter()
    save_file(state_dict, str(path))
    loaded = load_file(str(path))
    seconds = time.perf_counter() - started
    assert len(loaded) == len(state_dict)
    path.unlink()
    return seconds


def payload_floor(state_dict: dict[str, torch.Tensor], buffer_size: int) -> float:
    started = time.perf_counter()
    for bucket, _ in iter_buckets(state_dict.items(), buffer_size):
        payload = base64.b64encode(pickle.dumps(list(zip(bucket.names, bucket.tensors)), protocol=5))
        pickle.loads(base64.b64decode(payload))
    return time.perf_counter() - started


# ------------------------------------------------------------------ one preset
def run_preset(preset: str, args, work: Path) -> list[dict]:
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
    nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    engines_n = ENGINES.get(preset, 1)
    rows = []
    config = engine_config_for_tests(served, "--rollout-num-engines", str(engines_n))
    with EngineGroup(config, work / f"engines-{preset}") as engines, \
            MegatronGroup.from_hf_checkpoint(trained, ParallelConfig(), call_timeout_s=1800) as trainer:
        for transport in args.transports:
            cfg = build(WeightSyncConfig, transport=transport, buffer_size_bytes=args.buffer_size,
                                   disk_dir=str(work / f"sync-{preset}"), timeout_s=1800)
            floor = BroadcastFloor(nbytes, engines_n, args.rounds) if transport == "distributed" else None
            ours, floors, reports = [], [], []
            with WeightSync.create(cfg, trainer, engines.engine_urls, api_key=config.api_key) as sync:
                sync.update(0)  # warm-up: first-touch allocations on both sides
                for step in range(1, args.rounds + 1):
                    report = sync.update(step)
                    ours.append(report.seconds)
                    reports.append(report)
                    if transport == "distributed":
                        floors.append(floor.once())
                    elif transport == "disk":
                        floors.append(disk_floor(state_dict, work))
                    else:
                        floors.append(payload_floor(state_dict, args.buffer_size))
            if floor is not None:
                floor.close()
            last = reports[-1]
            rows.append(dict(preset=preset, transport=transport, engines=engines_n, mbytes=last.bytes / 1e6,
                             buckets=last.buckets, ours=statistics.median(ours), floor=statistics.median(floors),
                             probe=statistics.median(r.probe_seconds for r in reports),
                             export=statistics.median(r.export_seconds for r in reports),
                             max_diff=max(r.probe.max_abs_diff for r in reports)))
            assert last.bytes == nbytes, (last.bytes, nbytes)
            print(f"  {preset} {transport}: ours {rows[-1]['ours']:.3f} s, floor {rows[-1]['floor']:.3f} s", flush=True)
    return rows


FLOOR_NAMES = {"distributed": "gloo broadcast", "tensor": "pickle+b64 round trip", "disk": "safetensors write+read"}


def main(argv: list[str]) -> int:
    parser = bench_parser("weight_sync", __doc__, QUICK)
    parser.add_argument("--presets", nargs="+", default=["tiny", "base100m"], choices=sorted(ENGINES))
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--buffer-size", type=at_least(1), default=512 * 1024**2, help="--update-weight-buffer-size")
    parser.add_argument("--work-dir", default=None, help="checkpoints and logs (default: a temporary directory)")
    args = parse_bench_args(parser, argv)
    if args.work_dir and Path(args.work_dir).exists() and not Path(args.work_dir).is_dir():
        raise ConfigError(f"--work-dir {args.work_dir}: exists and is not a directory")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from lean_rl.utils.ray_utils import init_ray

    init_ray(num_cpus=2)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lean_rl_bench_wsync_"))
    rows = []
    for preset in args.presets:
        rows += run_preset(preset, args, work)
    print(f"\nweight sync, buffer {args.buffer_size / 2**20:.0f} MiB, median of {args.rounds} rounds (CPU, gloo)")
    header = f"{'model':9} {'transport':11} {'eng':>3} {'MB':>7} {'bkts':>4} {'ours s':>8} {'export':>7} " \
             f"{'floor s':>8} {'ratio':>6}  {'probe s':>7}  floor"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['preset']:9} {r['transport']:11} {r['engines']:>3} {r['mbytes']:7.1f} {r['buckets']:>4} "
              f"{r['ours']:8.3f} {r['export']:7.3f} {r['floor']:8.3f} {r['ours'] / r['floor']:5.1f}x  {r['probe']:7.3f}  "
              f"{FLOOR_NAMES[r['transport']]}")
    command = command_line("weight_sync", argv)
    write_rows(args.json, [
        row(f"weight sync, {r['preset']} ({r['mbytes']:.0f} MB) → {r['engines']} engine(s), {r['transport']}, "
            f"median of {args.rounds}", f"{r['ours']:.3f} s (export {r['export']:.3f} s)",
            f"{r['floor']:.3f} s {FLOOR_NAMES[r['transport']]}", r["ours"] / r["floor"], f"<= {GOAL}", command)
        for r in rows])
    return 0


if __name__ == "__main__":
    run_bench("weight_sync", main)
