"""Checkpoint conversion benchmark on a ~100M-parameter model (make_tiny_model preset base100m, or
--preset), re-saved as HF shards of --input-shard-size so that "one shard" means something:

    python bench/convert.py [--arch qwen2] [--preset base100m] [--input-shard-size 100MB] [--workdir DIR]
                            [--repeat 5] [--cache warm|cold]

For each direction it prints, beside floors measured in the same run:
- time ratio: conversion seconds / seconds to read the same input weight files and write files of the
  names and sizes the converter wrote (raw, 1 MiB blocks, one fsync per output file, as the converter
  syncs each: what any converter must at least do); the conversion's median of --repeat rounds over
  the floor's median, after one untimed round of each, rounds alternating which side goes first, every
  run from the same page-cache state (prime_cache: synced, both sides' outputs deleted, the input read
  once or dropped: --cache), both writing under the same --workdir (on this machine's 81%-full ext4 the
  CPU cost of writing the same 300 MB differed 4x between two sibling work directories: the floor and
  the conversion must write to the same place), with the VM's free page reporting held off for the
  rounds where this process may (bench/host_memory.py: the host's faults on memory it took back fell on
  either side by chance, 2-4x a round's CPU), and the floor's own spread between rounds printed;
- the same for CPU time (user + system of each process): on a loaded machine the wall time is mostly
  waiting for a core, the CPU time the work done. The seconds each side spends in fsync (the disk's
  part) are printed too. A ratio row whose floor spread exceeds the gap it reports (ratio - 1) is
  refused (its figure says so, no ratio): it could not tell the conversion from the floor;
- memory ratio: the converter process's peak RSS (VmHWM, imports included) / the largest input
  shard, and the same for the RSS it adds on top of its own imports (the streaming claim: about one
  shard plus the largest tensor, not the model);
- a projection to a 70B-class checkpoint from the measured MB/s (docs/performance.md).
Every measurement runs in a fresh process, so peaks do not mix."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_common import NO_GOAL, at_least, bench_parser, command_line, parse_bench_args, row, run_bench, write_rows
from floors import prime_cache, raw_copy, weight_files
from host_memory import reporting_held_off
from lean_rl.options import ConfigError
from lean_rl.testing.tiny_model import PRESETS

QUICK = {"repeat": 5}  # with 3, one slow round of either side set the median
CONVERT_GOAL = "<= 2"  # conversion time / the raw read + write of the same bytes (issue 42)


def _peak_rss_bytes() -> int:
    """VmHWM: this process image's peak RSS. (ru_maxrss is no good here: Linux carries it over from
    the forking parent across fork + exec.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _time_fsyncs() -> list[float]:
    """Count the seconds this process spends in os.fsync (the converters' writers and the floor all sync
    through it): the part of a run that is the disk's, whose speed on a shared virtual disk varies from
    run to run whatever the code (measured here: the same 300 MB fsync'd in 0.16 to 1.0 s)."""
    spent = [0.0]
    fsync = os.fsync

    def timed(fd: int) -> None:
        started = time.monotonic()
        try:
            fsync(fd)
        finally:
            spent[0] += time.monotonic() - started

    os.fsync = timed
    return spent


def worker(kind: str, src: str, dst: str, shard_size: str, clear: str) -> dict:
    """Runs in its own process; returns seconds, RSS after imports and peak RSS. Deletes `dst` and the
    `clear` paths (os.pathsep-separated) itself, after its imports, right before it starts: see run_once."""
    from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
    from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf
    from lean_rl.convert.safetensors_io import parse_size

    base = _current_rss_bytes()
    fsync_seconds = _time_fsyncs()
    for path in (dst, *filter(None, clear.split(os.pathsep))):
        shutil.rmtree(path, ignore_errors=True)
    os.sync()  # what earlier runs left dirty is written back now, not inside this run's fsyncs
    started, cpu_started, times_started = time.monotonic(), time.process_time(), os.times()
    if kind == "raw":  # SHARD is the converter's output directory: the files to write, as many and as large
        raw_copy(Path(src), Path(dst), Path(shard_size))
    elif kind == "hf_to_megatron":
        convert_hf_to_megatron(src, dst, max_file_bytes=parse_size(shard_size))
    elif kind == "megatron_to_hf":
        convert_megatron_to_hf(src, dst, max_shard_bytes=parse_size(shard_size))
    else:
        raise ValueError(kind)
    times = os.times()
    return {"seconds": time.monotonic() - started, "cpu_seconds": time.process_time() - cpu_started,
            "user_seconds": times.user - times_started.user, "system_seconds": times.system - times_started.system,
            "fsync_seconds": fsync_seconds[0], "rss_after_imports": base, "peak_rss": _peak_rss_bytes()}


def run_once(kind: str, src: Path, dst: Path, shard_size: str, cache: str, clear: tuple[Path, ...] = ()) -> dict:
    """One timed run of `kind` in a fresh process, after prime_cache, with `dst` and the other side's output
    (`clear`) deleted: both sides then start with the same free memory for the pages they write (a write
    into memory the kernel must first reclaim costs several times one into free pages: the floor's spread
    of 289% in issue 42's run came from that and from the first round). The worker deletes them itself,
    after its imports, right before it starts: deleted here, the conversion (~3 s of imports) began writing
    seconds after the deletion and the floor (no imports) at once, and on this VM pages freed seconds
    before cost ~2x those freed just before (the same conversion: 0.30-0.42 s started at once after deleting
    the last run's output, 0.68-0.90 s started 3 s after; the raw copy alike), so the two sides did not
    start from the same state (issue 42's 3.3x; the conversion rounds' own spread of 20-60%)."""
    prime_cache(src, cache)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, __file__, "--worker", kind, str(src), str(dst), shard_size,
                          os.pathsep.join(str(path) for path in clear)],
                         capture_output=True, text=True, env=env, timeout=1800, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_pair(kind: str, src: Path, dst: Path, raw_dst: Path, shard_size: str, repeat: int,
                 cache: str) -> tuple[dict, dict]:
    """(conversion, floor): a conversion first (untimed: its output is the floor's file layout), then
    `repeat` rounds of both, their order alternating per round so that drift of a shared machine hits
    both, each from the same cache state. Each side: every round's seconds, the median, the spread
    (slowest - fastest) / fastest, and the largest peak RSS."""
    run_once(kind, src, dst, shard_size, cache)
    layout = dst / "iter_0000000" if kind == "hf_to_megatron" else dst
    keep = dst.with_name(dst.name + ".layout")  # the floor's layout (names, sizes: sparse files), kept apart
    shutil.rmtree(keep, ignore_errors=True)  # from the conversion's reruns, which delete its output
    keep.mkdir(parents=True)
    for path in weight_files(layout):
        with open(keep / path.name, "wb") as f:
            f.truncate(path.stat().st_size)
    runs: dict[str, list[dict]] = {"conv": [], "raw": []}
    for number in range(-1, repeat):  # round -1: one untimed run of each (the first write to a path is slower)
        for side in (("conv", "raw") if number % 2 == 0 else ("raw", "conv")):
            if side == "conv":
                result = run_once(kind, src, dst, shard_size, cache, clear=(raw_dst,))
            else:
                result = run_once("raw", src, raw_dst, str(keep), cache, clear=(dst,))
            if number >= 0:
                runs[side].append(result)
    shutil.rmtree(keep, ignore_errors=True)
    if not dst.exists():  # the floor ran last and cleared it: the conversion's output is the next pair's input
        run_once(kind, src, dst, shard_size, cache)

    def summary(results: list[dict]) -> dict:
        seconds = [r["seconds"] for r in results]
        cpu = [r["cpu_seconds"] for r in results]
        return {"seconds": statistics.median(seconds), "rounds": seconds, "cpu_seconds": statistics.median(cpu),
                "cpu_rounds": cpu, "cpu_spread": max(cpu) / min(cpu) - 1,
                "fsync_seconds": statistics.median(r["fsync_seconds"] for r in results),
                "user_seconds": statistics.median(r["user_seconds"] for r in results),
                "system_seconds": statistics.median(r["system_seconds"] for r in results),
                "spread": max(seconds) / min(seconds) - 1,
                "rss_after_imports": max(r["rss_after_imports"] for r in results),
                "peak_rss": max(r["peak_rss"] for r in results)}

    return summary(runs["conv"]), summary(runs["raw"])


def prepare_input(workdir: Path, arch: str, shard_size: str, preset: str = "base100m") -> Path:
    """The preset's model, saved by transformers as shards of shard_size (cached in workdir)."""
    sharded = workdir / f"{preset}-{arch}-{shard_size}"
    if any((sharded / name).is_file() for name in ("model.safetensors.index.json", "model.safetensors")):
        return sharded  # (a model smaller than one shard is saved as one file, with no index)
    import torch
    import transformers

    from lean_rl.testing.tiny_model import make_tiny_model

    single = make_tiny_model(workdir / f"{preset}-{arch}", arch=arch, preset=preset)
    model = transformers.AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    tmp = sharded.with_name(sharded.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size=shard_size)
    for side in single.iterdir():
        if side.is_file() and not side.name.endswith(".safetensors") and not (tmp / side.name).exists():
            shutil.copyfile(side, tmp / side.name)
    os.replace(tmp, sharded)
    return sharded


def time_rows(name: str, model: str, conv: dict, raw: dict, repeat: int, cache: str, command: str,
              host: str) -> list[dict]:
    """The conversion's wall time and its CPU time, each over the floor's; a row whose floor spread between
    rounds exceeds the gap it reports (ratio - 1) is refused (figure 'refused: ...', no ratio): it could not
    tell the conversion from its floor."""
    rows = []
    for label, key, spread_key, what in (
            ("wall", "seconds", "spread", "time / a raw read of its input + write of its output files"),
            ("CPU", "cpu_seconds", "cpu_spread", "CPU time (user + system) / the same floor's CPU time")):
        ratio = conv[key] / max(raw[key], 1e-3)
        figure = (f"{conv[key]:.2f} s {label} (fsync {conv['fsync_seconds']:.2f} s)" if key == "seconds"
                  else f"{conv[key]:.2f} s CPU")
        floor = (f"{raw[key]:.2f} s {label}, raw read + write, fsync per file (fsync {raw['fsync_seconds']:.2f} s), "
                 f"median of {repeat} after one untimed round, spread {raw[spread_key]:.0%}; both from the same page "
                 f"cache ({cache} input, both sides' outputs deleted), rounds alternating; {host}")
        if raw[spread_key] > ratio - 1:
            figure, ratio = (f"refused: the floor's spread {raw[spread_key]:.0%} exceeds the gap it would report "
                             f"({ratio:.2f}x - 1); measured {figure}"), None
        rows.append(row(f"conversion {name} {what} ({model}, median of {repeat})", figure, floor, ratio,
                        CONVERT_GOAL, command, physical=True, noise=raw[spread_key]))
    return rows


def projection(model_bytes: int, to_megatron: dict, to_hf: dict, raw_hf: dict, raw_dist: dict) -> str:
    """A 70B-class checkpoint's conversion time from this run's rates (printed; docs/performance.md)."""
    big = 70e9 * 2  # 70B parameters in bf16
    lines = [f"projection to a 70B checkpoint ({big / 1e9:.0f} GB bf16), from this run's rates, assuming the "
             f"time grows with bytes (the converters stream: memory stays at one shard + one tensor)"
             + (": this model is too small for that, its fixed costs dominate (use base100m or larger)"
                if model_bytes < 100e6 else ":")]
    for name, conv, raw in (("hf->megatron", to_megatron, raw_hf), ("megatron->hf", to_hf, raw_dist)):
        wall, cpu = model_bytes / conv["seconds"], model_bytes / conv["cpu_seconds"]
        lines.append(f"  {name}: {wall / 1e6:.0f} MB/s wall -> {big / wall / 60:.1f} min; CPU-bound rate "
                     f"{cpu / 1e6:.0f} MB/s -> {big / cpu / 60:.1f} min of CPU (the floor here: "
                     f"{model_bytes / raw['seconds'] / 1e6:.0f} MB/s)")
    return "\n".join(lines)


def _files(directory: Path, suffix: str) -> list[Path]:
    return [p for p in directory.rglob(f"*{suffix}") if p.is_file()]


def main(argv: list[str]) -> int:
    parser = bench_parser("convert", __doc__, QUICK)
    parser.add_argument("--arch", default="qwen2", choices=("qwen2", "llama", "qwen3", "qwen3_moe"))
    parser.add_argument("--input-shard-size", default="100MB")
    parser.add_argument("--preset", default="base100m", choices=sorted(PRESETS), help="tiny-model preset converted")
    parser.add_argument("--workdir", default="/tmp/lean_rl_bench_convert")
    parser.add_argument("--repeat", type=at_least(1), default=5, help="rounds of conversion and floor, alternating "
                        "(median time of each, max RSS)")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm",
                        help="the page-cache state of the input at the start of every timed run, the same for the "
                             "conversion and its floor: read once (warm) or dropped with posix_fadvise (cold)")
    parser.add_argument("--worker", nargs=5, metavar=("KIND", "SRC", "DST", "SHARD", "CLEAR"), help=argparse.SUPPRESS)
    args = parse_bench_args(parser, argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0

    from safetensors import safe_open

    from lean_rl.convert.safetensors_io import parse_size

    try:
        parse_size(args.input_shard_size)
    except ValueError as err:
        raise ConfigError(f"--input-shard-size {args.input_shard_size}: {err}") from None
    workdir = Path(args.workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir {workdir}: exists and is not a directory")
    workdir.mkdir(parents=True, exist_ok=True)
    hf = prepare_input(workdir, args.arch, args.input_shard_size, args.preset)
    shards = _files(hf, ".safetensors")
    largest_shard = max(p.stat().st_size for p in shards)
    largest_tensor = 0
    params = 0
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                numel = 1
                for d in shape:
                    numel *= d
                params += numel
                largest_tensor = max(largest_tensor, numel * 4)

    megatron, hf_back = workdir / "megatron", workdir / "hf_back"
    with reporting_held_off() as host:  # the host's faults on reported memory fell on either side by chance
        print(host, flush=True)
        to_megatron, raw_hf = measure_pair("hf_to_megatron", hf, megatron, workdir / "raw_hf", args.input_shard_size,
                                           args.repeat, args.cache)
        dist_dir = megatron / "iter_0000000"
        to_hf, raw_dist = measure_pair("megatron_to_hf", megatron, hf_back, workdir / "raw_dist",
                                       args.input_shard_size, args.repeat, args.cache)
    largest_dist = max(p.stat().st_size for p in _files(dist_dir, ".distcp"))

    mib = 2**20
    print(f"\nmodel: {args.preset} {args.arch}, {params / 1e6:.1f}M parameters (float32), "
          f"{len(shards)} HF shards, largest shard {largest_shard / mib:.0f} MiB, largest tensor "
          f"{largest_tensor / mib:.1f} MiB; {len(_files(dist_dir, '.distcp'))} .distcp files, largest "
          f"{largest_dist / mib:.0f} MiB")
    header = (f"{'direction':<16}{'conv s':>8}{'raw r+w s':>11}{'time ratio':>12}{'peak RSS MiB':>14}"
              f"{'imports MiB':>13}{'input shard MiB':>17}{'peak/shard':>12}{'(peak-imports)/shard':>22}")
    print(header)
    print("-" * len(header))
    command = command_line("convert", argv)
    model = f"{args.preset} {args.arch}, {params / 1e6:.0f}M parameters, largest tensor {largest_tensor / mib:.0f} MiB"
    rows = []
    for name, conv, raw, shard in (("hf->megatron", to_megatron, raw_hf, largest_shard),
                                   ("megatron->hf", to_hf, raw_dist, largest_dist)):
        added = conv["peak_rss"] - conv["rss_after_imports"]
        rows += time_rows(name, model, conv, raw, args.repeat, args.cache, command, host)
        # the streaming claim: what the converter adds above its imports is about one input shard plus one tensor
        rows.append(row(f"conversion {name} peak RSS above the interpreter's imports ({conv['rss_after_imports'] / mib:.0f}"
                        f" MiB) / the largest input shard ({model})", f"{added / mib:.0f} MiB",
                        f"{shard / mib:.0f} MiB shard", added / shard,
                        f"<= {(shard + largest_tensor) / shard:.2f} (one shard + the largest tensor)", command))
        print(f"{name:<16}{conv['seconds']:>8.2f}{raw['seconds']:>11.2f}{conv['seconds'] / raw['seconds']:>12.2f}"
              f"{conv['peak_rss'] / mib:>14.0f}{conv['rss_after_imports'] / mib:>13.0f}{shard / mib:>17.0f}"
              f"{conv['peak_rss'] / shard:>12.2f}{added / shard:>22.2f}")
    model_bytes = sum(p.stat().st_size for p in shards)
    print(f"(model {model_bytes / mib:.0f} MiB; raw r+w floor process: peak RSS {raw_hf['peak_rss'] / mib:.0f} MiB; "
          f"median of {args.repeat} runs each, {args.cache} input cache for both sides)")
    for name, conv, raw in (("hf->megatron", to_megatron, raw_hf), ("megatron->hf", to_hf, raw_dist)):
        for side, runs in (("conversion", conv), ("floor", raw)):
            print(f"  {name} {side} rounds: wall {' '.join(f'{x:.2f}' for x in runs['rounds'])} s (spread "
                  f"{runs['spread']:.0%}), CPU {' '.join(f'{x:.2f}' for x in runs['cpu_rounds'])} s (spread "
                  f"{runs['cpu_spread']:.0%}; median user {runs['user_seconds']:.2f} s, system {runs['system_seconds']:.2f} s), "
                  f"fsync {runs['fsync_seconds']:.2f} s (median)")
    print(projection(model_bytes, to_megatron, to_hf, raw_hf, raw_dist))
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("convert", main)
