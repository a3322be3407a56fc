"""Checkpoint conversion benchmark on a ~100M-parameter model (make_tiny_model preset base100m),
re-saved as HF shards of --input-shard-size so that "one shard" means something:

    python bench/convert.py [--arch qwen2] [--input-shard-size 100MB] [--workdir DIR] [--repeat 3]

For each direction it prints, beside floors measured in the same run:
- time ratio: conversion seconds / seconds to read the same input weight files and write files of the
  names and sizes the converter wrote (raw, 1 MiB blocks, one fsync per output file, as the converter
  syncs each: what any converter must at least do); the conversion's median of --repeat runs over the
  floor's best, each run after an os.sync() so that none pays for another's writeback;
- memory ratio: the converter process's peak RSS (VmHWM, imports included) / the largest input
  shard, and the same for the RSS it adds on top of its own imports (the streaming claim: about one
  shard plus the largest tensor, not the model).
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
from lean_rl.options import ConfigError

BLOCK = 2**20  # the floor's read and write size (the converters write about 1 MB at a time)
QUICK = {"repeat": 2}


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


def worker(kind: str, src: str, dst: str, shard_size: str) -> dict:
    """Runs in its own process; returns seconds, RSS after imports and peak RSS."""
    from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
    from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf
    from lean_rl.convert.safetensors_io import parse_size

    base = _current_rss_bytes()
    os.sync()  # what earlier runs left dirty is written back now, not inside this run's fsyncs
    started = time.monotonic()
    if kind == "raw":  # SHARD is the converter's output directory: the files to write, as many and as large
        raw_copy(Path(src), Path(dst), Path(shard_size))
    elif kind == "hf_to_megatron":
        convert_hf_to_megatron(src, dst, max_file_bytes=parse_size(shard_size))
    elif kind == "megatron_to_hf":
        convert_megatron_to_hf(src, dst, max_shard_bytes=parse_size(shard_size))
    else:
        raise ValueError(kind)
    return {"seconds": time.monotonic() - started, "rss_after_imports": base, "peak_rss": _peak_rss_bytes()}


def _weight_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.suffix in (".safetensors", ".distcp"))


def raw_copy(src: Path, dst: Path, layout: Path) -> None:
    """The physical floor of a conversion: read every weight file of `src` and write the files the converter
    wrote to `layout` (the same names and sizes, so the same number of fsyncs), through one buffer
    (readinto, no copies), then one fsync per file; the bytes written are the bytes read (zeros past the end of
    the input, where the output is the larger)."""
    dst.mkdir(parents=True)
    inputs = iter(_weight_files(src))
    reader = None
    buffer = bytearray(BLOCK)

    def fill(view: memoryview) -> None:
        nonlocal reader
        got = 0
        while got < len(view):
            if reader is None:
                path = next(inputs, None)
                if path is None:
                    view[got:] = bytes(len(view) - got)
                    return
                reader = open(path, "rb", buffering=0)
            n = reader.readinto(view[got:])
            if not n:
                reader.close()
                reader = None
            got += n or 0

    written = []
    for target in _weight_files(layout):
        left = target.stat().st_size
        with open(dst / target.name, "wb") as writer:
            while left > 0:
                view = memoryview(buffer)[:min(BLOCK, left)]
                fill(view)
                writer.write(view)
                left -= len(view)
        written.append(dst / target.name)
    for path in written:  # as the converters do: every file written, then each synced
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    while True:  # every input byte is read, as the converter reads it
        if reader is None:
            path = next(inputs, None)
            if path is None:
                return
            reader = open(path, "rb", buffering=0)
        while reader.readinto(buffer):
            pass
        reader.close()
        reader = None


def measure(kind: str, src: Path, dst: Path, shard_size: str, repeat: int) -> dict:
    """Median seconds and largest peak RSS over `repeat` fresh processes (this box is shared)."""
    runs = []
    for _ in range(repeat):
        shutil.rmtree(dst, ignore_errors=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, __file__, "--worker", kind, str(src), str(dst), shard_size],
                             capture_output=True, text=True, env=env, timeout=1800, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{kind} failed:\n{out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    seconds = [r["seconds"] for r in runs]
    # a floor is the best its runs did (noise only slows a run down); a conversion its median run
    return {"seconds": min(seconds) if kind == "raw" else statistics.median(seconds),
            "rss_after_imports": max(r["rss_after_imports"] for r in runs),
            "peak_rss": max(r["peak_rss"] for r in runs)}


def prepare_input(workdir: Path, arch: str, shard_size: str) -> Path:
    """base100m, saved by transformers as shards of shard_size (cached in workdir)."""
    sharded = workdir / f"base100m-{arch}-{shard_size}"
    if (sharded / "model.safetensors.index.json").is_file():
        return sharded
    import torch
    import transformers

    from lean_rl.testing.tiny_model import make_tiny_model

    single = make_tiny_model(workdir / f"base100m-{arch}", arch=arch, preset="base100m")
    model = transformers.AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    tmp = sharded.with_name(sharded.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size=shard_size)
    for side in single.iterdir():
        if side.is_file() and not side.name.endswith(".safetensors") and not (tmp / side.name).exists():
            shutil.copyfile(side, tmp / side.name)
    os.replace(tmp, sharded)
    return sharded


def _files(directory: Path, suffix: str) -> list[Path]:
    return [p for p in directory.rglob(f"*{suffix}") if p.is_file()]


def main(argv: list[str]) -> int:
    parser = bench_parser("convert", __doc__, QUICK)
    parser.add_argument("--arch", default="qwen2", choices=("qwen2", "llama", "qwen3", "qwen3_moe"))
    parser.add_argument("--input-shard-size", default="100MB")
    parser.add_argument("--workdir", default="/tmp/lean_rl_bench_convert")
    parser.add_argument("--repeat", type=at_least(1), default=3, help="runs per measurement (median time, max RSS)")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "SRC", "DST", "SHARD"), help=argparse.SUPPRESS)
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
    hf = prepare_input(workdir, args.arch, args.input_shard_size)
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
    to_megatron = measure("hf_to_megatron", hf, megatron, args.input_shard_size, args.repeat)
    dist_dir = megatron / "iter_0000000"
    raw_hf = measure("raw", hf, workdir / "raw_hf", str(dist_dir), args.repeat)
    to_hf = measure("megatron_to_hf", megatron, hf_back, args.input_shard_size, args.repeat)
    raw_dist = measure("raw", dist_dir, workdir / "raw_dist", str(hf_back), args.repeat)
    largest_dist = max(p.stat().st_size for p in _files(dist_dir, ".distcp"))

    mib = 2**20
    print(f"\nmodel: base100m {args.arch}, {params / 1e6:.1f}M parameters (float32), "
          f"{len(shards)} HF shards, largest shard {largest_shard / mib:.0f} MiB, largest tensor "
          f"{largest_tensor / mib:.1f} MiB; {len(_files(dist_dir, '.distcp'))} .distcp files, largest "
          f"{largest_dist / mib:.0f} MiB")
    header = (f"{'direction':<16}{'conv s':>8}{'raw r+w s':>11}{'time ratio':>12}{'peak RSS MiB':>14}"
              f"{'imports MiB':>13}{'input shard MiB':>17}{'peak/shard':>12}{'(peak-imports)/shard':>22}")
    print(header)
    print("-" * len(header))
    command = command_line("convert", argv)
    model = f"base100m {args.arch}, {params / 1e6:.0f}M parameters, largest tensor {largest_tensor / mib:.0f} MiB"
    rows = []
    for name, conv, raw, shard in (("hf->megatron", to_megatron, raw_hf, largest_shard),
                                   ("megatron->hf", to_hf, raw_dist, largest_dist)):
        added = conv["peak_rss"] - conv["rss_after_imports"]
        rows.append(row(f"conversion {name} time / a raw read of its input + write of its output files ({model}, "
                        f"median of {args.repeat})", f"{conv['seconds']:.2f} s",
                        f"{raw['seconds']:.2f} s raw read + write, fsync per file, best of {args.repeat}",
                        conv["seconds"] / raw["seconds"], NO_GOAL, command, physical=True))
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
          f"median of {args.repeat} runs each)")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    run_bench("convert", main)
