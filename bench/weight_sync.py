"""Weight sync: seconds per sync for each transport vs its floor measured in the same run, as a ratio.

    .venv/bin/python bench/weight_sync.py [--presets tiny base100m] [--rounds 3]
                                          [--transports distributed tensor disk] [--buffer-size BYTES]

A Megatron group (one rank, gloo) loads a tiny-model checkpoint (seed 1) and syncs it to SGLang
engines serving the seed-0 checkpoint of the same preset (tiny: 2 engines, base100m: 1 engine). Ours
is SyncReport.seconds: from the start of update() until every engine holds the weights (export from
Megatron, buckets, HTTP, engine load; the probe that follows is reported apart). Floors are physical:
the simplest code that moves the same bytes (the HF state dict in the sync dtype) through the same
medium, in the same run (bench/floors.py), over loopback to as many receiver processes as engines:
- distributed: the raw bytes, one TCP send to each receiver (what the broadcast must move at least);
- tensor (CPU): the inline payload made (pickle + base64 per bucket), sent to each receiver over TCP and
  decoded there (on GPU the transport sends CUDA IPC handles instead; not measured here);
- disk: the raw bytes written to one file and read back into memory allocated (and touched) once, as an
  engine's parameters are (a buffer allocated per round would pay ~75k page faults the engine does not).
Beside the physical floor, each transport gets the floor of the medium SGLang offers, measured bare in
the same run: distributed, the same tensors broadcast over a gloo group built as the engines build
theirs, to receivers allocating fresh tensors per update as SGLang's receive does and copying them into
tensors allocated once, as its load_weights does into the parameters (floors.GlooFloor);
tensor, the floor's payload posted to the same engines by a bare HTTP client (begin, one update per
bucket, end: what SGLang requires); disk, the bytes written by safetensors' save_file and loaded by the
same engines with a bare /update_weights_from_disk (bench/bare_media.py). Ours over that medium is the part of the gap that
is ours (export, our HTTP client, the session, staging); the medium over the physical floor is SGLang's
receive path and, for distributed, gloo.
Fixed overhead: the sync of the tiny preset (0.8 MB, as good as empty) in the same run; with it, the
larger preset's row splits its time into that fixed part and the rest's bytes per second.
Rounds alternate ours and floor so that drift of a shared machine hits both; ours' median is compared
with the floor's best round.
`export` is the part of ours spent gathering HF tensors from the Megatron shards.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from bare_media import BareDiskLoad, BareSession, BareTensorPosts, EnginesServing, encoded_buckets
from bench_common import (NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench,
                          work_dir_with_ray, write_rows)
from floors import GlooFloor, SocketFloor
from lean_rl.options import build
from lean_rl.weight_sync.buckets import iter_buckets

ENGINES = {"tiny": 2, "small": 2, "base100m": 1}
TRANSPORTS = ("distributed", "tensor", "disk")
QUICK = {"presets": ["tiny", "base100m"], "rounds": 5}  # 2 left the export median at 0.06-0.18 s run to run (issue 42)
GOAL = 1.5  # ours / floor


# ------------------------------------------------------------------ floors
def raw_bytes(state_dict: dict[str, torch.Tensor]) -> list[memoryview]:
    """The state dict's bytes as they sit in memory, one view per tensor (no copy)."""
    return [memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()) for t in state_dict.values()]


def touched_buffer(nbytes: int) -> bytearray:
    """Memory for the bytes to land in, allocated and touched once, as an engine's parameters are."""
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    for start in range(0, nbytes, 4096):
        view[start] = 1
    return buffer


def disk_floor(state_dict: dict[str, torch.Tensor], directory: Path, into: bytearray) -> float:
    """The bytes written to one file and read back into `into` (what the disk transport moves, without
    its format)."""
    path = directory / "floor.bin"
    views = raw_bytes(state_dict)
    started = time.perf_counter()
    with open(path, "wb") as out:
        for view in views:
            out.write(view)
    with open(path, "rb") as source:
        got = source.readinto(into)
    seconds = time.perf_counter() - started
    assert got == len(into) == sum(len(v) for v in views), (got, len(into))
    path.unlink()
    return seconds


class Floor:
    """The floor of one transport over loopback, receivers kept for all rounds (bench/floors.py):
    distributed, the raw bytes sent once to each engine's receiver; tensor, the inline payload made
    (pickle + base64 per bucket), sent to each receiver, decoded there; disk, one file write + read.
    `medium_once`, given `engines`: the medium SGLang offers, bare (distributed: GlooFloor; tensor:
    BareTensorPosts; disk: BareDiskLoad); None without. `session_once`, given `engines`, for the streamed
    transports: the session SGLang requires around their updates, bare and empty (BareSession)."""

    def __init__(self, transport: str, state_dict: dict[str, torch.Tensor], receivers: int, rounds: int,
                 buffer_size: int, work: Path, engines: EnginesServing | None = None):
        self.transport, self.state_dict, self.work, self.buffer_size = transport, state_dict, work, buffer_size
        self.socket = self.medium = self.session = None
        if engines is not None and transport in ("distributed", "tensor"):
            self.session = BareSession(engines.urls, engines.api_key)
        if transport == "distributed":
            self.parts = raw_bytes(state_dict)
            self.socket = SocketFloor(receivers, len(self.parts), rounds)
            if engines is not None:
                self.medium = GlooFloor(list(state_dict.values()), receivers, rounds)
        elif transport == "tensor":
            count = sum(1 for _ in iter_buckets(state_dict.items(), buffer_size))
            self.socket = SocketFloor(receivers, count, rounds, decode=True)
            if engines is not None:
                self.medium = BareTensorPosts(engines.urls, engines.api_key, state_dict, buffer_size)
        else:
            self.into = touched_buffer(sum(t.numel() * t.element_size() for t in state_dict.values()))
            if engines is not None:
                self.medium = BareDiskLoad(engines.urls, engines.api_key, state_dict, engines.served,
                                           work / "disk-medium")

    def once(self) -> float:
        if self.transport == "disk":
            return disk_floor(self.state_dict, self.work, self.into)
        if self.transport == "tensor":
            payloads, encode_seconds = encoded_buckets(self.state_dict, self.buffer_size)
            return encode_seconds + self.socket.once(payloads)
        return self.socket.once(self.parts)

    def medium_once(self) -> float | None:
        return None if self.medium is None else self.medium.once()

    def session_once(self) -> float | None:
        return None if self.session is None else self.session.once()

    def close(self) -> None:
        for part in (self.socket, self.medium):
            if part is not None:
                part.close()


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
            floor = Floor(transport, state_dict, engines_n, args.rounds + 1, args.buffer_size, work,
                          EnginesServing(engines.engine_urls, config.api_key, served))
            ours, floors, mediums, sessions, reports = [], [], [], [], []
            try:
                with WeightSync.create(cfg, trainer, engines.engine_urls, api_key=config.api_key) as sync:
                    sync.update(0)  # warm-up: first-touch allocations on both sides
                    floor.once()
                    floor.medium_once()
                    floor.session_once()
                    for step in range(1, args.rounds + 1):
                        report = sync.update(step)
                        ours.append(report.seconds)
                        reports.append(report)
                        floors.append(floor.once())
                        mediums.append(floor.medium_once())
                        sessions.append(floor.session_once())
            finally:
                floor.close()
            last = reports[-1]
            rows.append(dict(preset=preset, transport=transport, engines=engines_n, mbytes=last.bytes / 1e6,
                             buckets=last.buckets, ours=statistics.median(ours), floor=min(floors),
                             floor_spread=(max(floors) - min(floors)) / min(floors),
                             medium=None if mediums[0] is None else min(mediums),
                             medium_spread=None if mediums[0] is None else (max(mediums) - min(mediums)) / min(mediums),
                             session=None if sessions[0] is None else min(sessions),
                             probe=statistics.median(r.probe_seconds for r in reports),
                             export=statistics.median(r.export_seconds for r in reports),
                             max_diff=max(r.probe.max_abs_diff for r in reports)))
            assert last.bytes == nbytes, (last.bytes, nbytes)
            medium = "" if rows[-1]["medium"] is None else f", bare medium {rows[-1]['medium']:.3f} s"
            print(f"  {preset} {transport}: ours {rows[-1]['ours']:.3f} s, floor {rows[-1]['floor']:.3f} s{medium}", flush=True)
    return rows


FLOOR_NAMES = {"distributed": "raw TCP send of the bytes to each engine's receiver",
               "tensor": "pickle+b64 per bucket, TCP send, decode at each receiver",
               "disk": "raw file write + read of the bytes"}
MEDIUM_NAMES = {"distributed": "the same tensors broadcast bare over a gloo group built as the engines build theirs, "
                               "receivers allocating fresh tensors per update and copying them into their "
                               "parameters as SGLang does",
                "tensor": "the floor's payload posted bare to the same engines (begin, update per bucket, end)",
                "disk": "the bytes written by safetensors' save_file, /update_weights_from_disk posted bare to the same engines"}
FIXED_PRESET = "tiny"  # its sync is the fixed overhead of the others' rows
FIXED_GOAL_S = 0.010  # a sync's fixed overhead (issue 42)
GPU_MEDIUM = {"distributed": "an NCCL broadcast", "tensor": "CUDA IPC handles (no bytes copied)",
              "disk": "the same files"}


def _medium_why(r: dict) -> str | None:
    """Why ours misses the goal against the physical floor on this machine, measured in this run: the medium
    SGLang offers, driven bare, is itself slower than the floor by more than the floor's noise, and ours over
    that medium (the part that is ours) meets the goal. None otherwise: the gap is ours."""
    if r["medium"] is None or r["medium"] / r["floor"] <= 1 + r["floor_spread"]:
        return None
    if r["ours"] / r["medium"] > GOAL + r["medium_spread"]:
        return None
    return (f"SGLang's medium, driven bare in this run, is itself {r['medium'] / r['floor']:.2f}x this floor; ours "
            f"is {r['ours'] / r['medium']:.2f}x that medium (its row below: the part that is ours). On GPU the "
            f"medium is {GPU_MEDIUM[r['transport']]}: not measured here")


def _figure(r: dict, fixed: dict | None) -> str:
    """Seconds and export; beside the fixed preset's sync, the split into that and bytes per second."""
    text = f"{r['ours']:.3f} s (export {r['export']:.3f} s)"
    if r["preset"] == FIXED_PRESET:
        return text + "; the fixed overhead of a sync"
    if fixed is not None and r["ours"] > fixed["ours"]:
        rate = (r["mbytes"] - fixed["mbytes"]) / (r["ours"] - fixed["ours"])
        text += f" = {fixed['ours']:.3f} s fixed + {rate:.0f} MB/s"
    return text


def main(argv: list[str]) -> int:
    parser = bench_parser("weight_sync", __doc__, QUICK)
    parser.add_argument("--presets", nargs="+", default=["tiny", "base100m"], choices=sorted(ENGINES))
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--buffer-size", type=at_least(1), default=512 * 1024**2, help="--update-weight-buffer-size")
    parser.add_argument("--work-dir", default=None, help="checkpoints and logs (default: a temporary directory)")
    args = parse_bench_args(parser, argv)
    work = work_dir_with_ray(args.work_dir, "lean_rl_bench_wsync_")
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
    fixed = {r["transport"]: r for r in rows if r["preset"] == FIXED_PRESET}
    write_rows(args.json, [
        row(f"weight sync, {r['preset']} ({r['mbytes']:.1f} MB) → {r['engines']} engine(s), {r['transport']}, "
            f"median of {args.rounds}", _figure(r, fixed.get(r["transport"])),
            f"{r['floor']:.3f} s {FLOOR_NAMES[r['transport']]}, best of {args.rounds}", r["ours"] / r["floor"],
            NO_GOAL if r["preset"] == FIXED_PRESET else f"<= {GOAL}", command, physical=True,
            noise=r["floor_spread"], why=_medium_why(r))
        for r in rows] + [
        row(f"weight sync, {r['preset']} ({r['mbytes']:.1f} MB) → {r['engines']} engine(s), {r['transport']} / "
            f"SGLang's medium bare (ours' part of the gap), median of {args.rounds}", f"{r['ours']:.3f} s",
            f"{r['medium']:.3f} s {MEDIUM_NAMES[r['transport']]}, best of {args.rounds}", r["ours"] / r["medium"],
            NO_GOAL if r["preset"] == FIXED_PRESET else f"<= {GOAL}", command, physical=True,
            noise=r["medium_spread"])
        for r in rows if r["medium"] is not None] + [_fixed_row(r, args.rounds, command)
                                                     for r in rows if r["preset"] == FIXED_PRESET and r["session"]])
    return 0


def _fixed_row(r: dict, rounds: int, command: str) -> dict:
    """The fixed overhead of a streamed sync (the tiny preset's) over the goal's 10 ms, beside the least that
    SGLang's medium costs here, driven bare: tensor, its medium (begin, the update, end); distributed, the
    empty session (begin + end) plus the bare gloo broadcast (the update call's round trip not counted)."""
    least = r["medium"] if r["transport"] == "tensor" else r["session"] + r["medium"]
    parts = ("begin, update, end posted bare" if r["transport"] == "tensor"
             else f"the empty session (begin + end) {r['session'] * 1e3:.1f} ms + the bare gloo broadcast "
                  f"{r['medium'] * 1e3:.1f} ms")
    why = None
    if least > FIXED_GOAL_S:
        why = (f"SGLang accepts {r['transport']} updates only inside a /begin_weight_update ... /end_weight_update "
               f"session; its medium, driven bare to these engines in this run, takes at least {least * 1e3:.1f} ms "
               f"({parts}); ours is {r['ours'] / least:.1f}x that. On GPU: the same HTTP calls, not measured here")
    return row(f"weight sync's fixed overhead, {r['preset']} ({r['mbytes']:.1f} MB) → {r['engines']} engine(s), "
               f"{r['transport']}, median of {rounds} / the goal's 10 ms", f"{r['ours'] * 1e3:.1f} ms",
               f"10 ms; SGLang's medium driven bare to the same engines: {least * 1e3:.1f} ms ({parts}), best of "
               f"{rounds} each", r["ours"] / FIXED_GOAL_S, "<= 1 (10 ms)", command, why=why)


if __name__ == "__main__":
    run_bench("weight_sync", main)
