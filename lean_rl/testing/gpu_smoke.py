"""The device smoke check of issue 22 (the plan in ../shared/reviews/gpu-static-2026-12-02.md §4): the
GPU paths that no CPU run takes, each step one JSON line on stdout, in under 8 minutes on one GPU.

    bash scripts/gpu-smoke.sh [--device cuda|cpu] [--steps env,trainer,engine,memory,loop] [--out DIR]

Steps (each needs what the one before it showed to work; a step whose packages are missing prints
{"step": ..., "skipped": why} and the next goes on):
- env: torch, CUDA, TransformerEngine as Megatron sees it (E1, C3), SGLang, Ray, the trainer ranks' NCCL
  switches (C6).
- trainer: the tiny model in one Megatron rank hosted in this process (no Ray needed): log-probs against
  transformers' float32 forward (TE names and parity), one train step in float32 and one in bfloat16
  (--bf16: the float32 master weights of Megatron's mixed-precision optimizer), an offload / onload
  round trip (bytes released, weights bit-identical: P2).
- engine: one colocated SGLang engine and the trainer on Ray; tensor transport (CUDA IPC) syncs in the
  engine's default dtype (the trainer's) and in bfloat16 against a float32 trainer: probe figures (C2).
- memory: the same engine with --enable-memory-saver (colocated): release everything, resume weights,
  sync, resume the KV cache, probe; then a /health while released must not kill the scheduler (M1-M3).
- loop: `python -m lean_rl.train --colocate --num-rollout 2` on the tiny model (one full loop).
On CPU (--device cpu) env and trainer run as they do on a GPU; CI runs them (tests/integration/
test_gpu_smoke.py). The engine steps need a GPU and SGLang's GPU build.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from lean_rl.options import build, rebuild

STEPS = ("env", "trainer", "engine", "memory", "loop")


def emit(step: str, **fields) -> dict:
    line = {"step": step, **fields}
    print(json.dumps(line, default=str), flush=True)
    return line


def missing(*modules: str) -> str | None:
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(absent)}" if absent else None


def step_env(device: str, out: Path) -> dict:
    import torch

    from lean_rl.backends.megatron.group import rank_env

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
             "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
             "rank_nccl_env": {k: v for k, v in rank_env(device, 1, None).items() if k.startswith("NCCL")}}
    if importlib.util.find_spec("megatron") is not None:
        from lean_rl.backends.megatron.compat import transformer_engine_available

        facts["megatron_have_te"] = transformer_engine_available()
    for name in ("transformer_engine", "sglang", "ray", "transformers"):
        facts[name] = importlib.util.find_spec(name) is not None
    return emit("env", ok=device == "cpu" or facts["cuda_available"], **facts)


def step_trainer(device: str, out: Path) -> dict:
    reason = missing("megatron", "transformers")
    if reason:
        return emit("trainer", skipped=reason)
    import torch
    import transformers

    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import MegatronGroup
    from lean_rl.backends.megatron.train_config import BatchConfig, CheckpointConfig, OptimizerConfig, TrainConfig
    from lean_rl.backends.megatron.train_driver import initialize_for_training, train_on_rollout
    from lean_rl.testing.sample_groups import make_groups, set_rollout_log_probs
    from lean_rl.testing.tiny_model import make_tiny_model

    model = make_tiny_model(out / "tiny", arch="qwen2", seed=0)
    groups = make_groups(seed=1)
    tokens = [s.tokens for g in groups for s in g][:4]
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    expected = []
    with torch.no_grad():
        for seq in tokens:
            logits = hf(torch.tensor([seq])).logits[0, :-1].float()
            expected.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0])
    train = TrainConfig(optimizer=OptimizerConfig(lr=1e-4), batch=BatchConfig(micro_batch_size=2),
                        checkpoint=CheckpointConfig(hf_checkpoint=str(model)))
    result = {}
    for dtype in ("float32", "bfloat16"):
        started = time.perf_counter()
        group = MegatronGroup.from_hf_checkpoint(model, ParallelConfig(), world_size=1, device=device,
                                                 params_dtype=dtype, in_process=True)
        try:
            got = group.compute_log_probs(tokens).log_probs
            gap = max(float((a - b).abs().max()) for a, b in zip(got, expected))
            initialize_for_training(group, train, build(AlgorithmConfig, use_rollout_logprobs=True))
            set_rollout_log_probs(group, groups)
            metrics = train_on_rollout(group, groups, policy_version=0)
            before = group.gather_hf_state_dict()
            offload = group.offload()
            onload = group.onload()
            after = group.gather_hf_state_dict()
            identical = all(torch.equal(before[k], after[k]) for k in before)
        finally:
            group.shutdown()
        result[dtype] = {"max_abs_logprob_diff_vs_hf_fp32": gap, "pg_loss": metrics["train/pg_loss"],
                         "grad_norm": metrics["train/grad_norm"], "offload": offload, "onload": onload,
                         "weights_identical_after_onload": identical, "seconds": time.perf_counter() - started}
    ok = (result["float32"]["max_abs_logprob_diff_vs_hf_fp32"] < 1e-3
          and result["bfloat16"]["max_abs_logprob_diff_vs_hf_fp32"] < 1.0
          and all(r["weights_identical_after_onload"] for r in result.values())
          and all(torch.isfinite(torch.tensor(r["pg_loss"])) for r in result.values()))
    return emit("trainer", ok=bool(ok), **result)


def _engine_and_trainer(device: str, out: Path, *engine_flags: str):
    """A colocated engine and a trainer of one rank on a local Ray, as a run places them."""
    from lean_rl.backends.megatron.config import ParallelConfig
    from lean_rl.backends.megatron.group import COLOCATED_RANK_SHARE, MegatronGroup
    from lean_rl.backends.megatron.train_config import TrainerLayout
    from lean_rl.backends.sglang.engine_placement import colocated_placement
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.utils.ray_utils import init_ray

    init_ray(num_cpus=4)
    model = make_tiny_model(out / "tiny", arch="qwen2", seed=0)
    layout = TrainerLayout.derive(ParallelConfig(), 1, device)
    trainer = MegatronGroup.from_hf_checkpoint(model, ParallelConfig(), layout=layout, colocated=True)
    config = rebuild(engine_config_for_tests(model, "--rollout-num-engines", "1",
                                                         "--sglang-max-total-tokens", "8192",
                                                         "--engine-start-timeout", "600", *engine_flags),
                                 colocated=True)
    placement = colocated_placement(trainer.placement_group, [0], device=device, ranks_per_node=1,
                                    rank_gpu_ids=trainer.rank_gpu_ids, rank_share=COLOCATED_RANK_SHARE,
                                    cpus_per_rank=trainer.cpus_per_rank, gpus_per_engine=config.gpus_per_engine)
    engines = EngineGroup(config, out / "engines", placement=placement).start()
    return trainer, engines, config


def step_engine(device: str, out: Path) -> dict:
    reason = missing("sglang", "ray", "megatron")
    if reason:
        return emit("engine", skipped=reason)
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync

    rows = {}
    for label, flags in (("engine_fp32", ("--sglang-dtype", "float32")), ("engine_bf16", ("--sglang-dtype", "bfloat16"))):
        trainer, engines, config = _engine_and_trainer(device, out / label, *flags)
        try:
            with WeightSync.create(build(WeightSyncConfig, transport="tensor", colocate=True, device=device, probe_tol=1e9),
                                   trainer, engines.engine_urls, api_key=config.api_key) as sync:
                report = sync.update(1)
                rows[label] = {"max": report.probe.max_abs_diff, "mean": report.probe.mean_abs_diff,
                               "bytes": report.bytes, "seconds": report.seconds,
                               "default_tolerance": build(WeightSyncConfig).probe_tolerance(sync.trainer_dtype, sync.engine_dtype)}
        finally:
            engines.stop()
            trainer.shutdown()
    ok = rows["engine_fp32"]["max"] <= 1e-3 and rows["engine_bf16"]["mean"] <= rows["engine_bf16"]["default_tolerance"]
    return emit("engine", ok=bool(ok), **rows)


def step_memory(device: str, out: Path) -> dict:
    reason = missing("sglang", "ray", "megatron") or (None if device == "cuda" else "releases memory on GPU only")
    if reason:
        return emit("memory", skipped=reason)
    import httpx
    import torch

    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.memory import ALL
    from lean_rl.weight_sync.sync import WeightSync

    trainer, engines, config = _engine_and_trainer(device, out / "memory")
    try:
        with WeightSync.create(build(WeightSyncConfig, transport="tensor", colocate=True, device=device), trainer,
                               engines.engine_urls, api_key=config.api_key) as sync:
            sync.update(0)
            free_before = torch.cuda.mem_get_info()[0]
            sync.memory.release(ALL)
            freed = torch.cuda.mem_get_info()[0] - free_before
            health = httpx.get(f"{engines.engine_urls[0]}/health", timeout=30).status_code  # needs no key
            report = sync.update(1)  # resumes weights, syncs, resumes the KV cache, probes
            alive = engines.engine_alive(0)
        row = {"freed_bytes_seen_by_this_process": freed, "health_while_released": health,
               "probe_after_resume": report.probe.max_abs_diff, "engine_alive": alive}
    finally:
        engines.stop()
        trainer.shutdown()
    return emit("memory", ok=bool(freed > 0 and alive), **row)


def step_loop(device: str, out: Path) -> dict:
    reason = missing("sglang", "ray", "megatron")
    if reason:
        return emit("loop", skipped=reason)
    from lean_rl.testing.tiny_model import make_tiny_model
    from lean_rl.testing.toy_task import write_dataset

    model = make_tiny_model(out / "tiny", arch="qwen2", seed=0)
    write_dataset(out / "train.jsonl", 64, seed=0)
    cmd = [sys.executable, "-m", "lean_rl.train", "--hf-checkpoint", str(model), "--prompt-data",
           str(out / "train.jsonl"), "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
           "--colocate", "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
           "--rollout-max-response-len", "12", "--micro-batch-size", "8", "--output-dir", str(out / "loop"),
           "--no-tensorboard", "--sglang-max-total-tokens", "8192", "--engine-start-timeout", "600"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    metrics = out / "loop" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    return emit("loop", ok=proc.returncode == 0 and len(rows) == 2, returncode=proc.returncode,
                seconds=time.perf_counter() - started,
                probe=[r.get("sync/probe_mean_abs_diff") for r in rows],
                tail=None if proc.returncode == 0 else proc.stderr[-2000:])


RUNNERS = {"env": step_env, "trainer": step_trainer, "engine": step_engine, "memory": step_memory, "loop": step_loop}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-smoke.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {', '.join(STEPS)}")
    parser.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    steps = args.steps.split(",")
    unknown = [s for s in steps if s not in RUNNERS]
    if unknown:
        parser.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out or tempfile.mkdtemp(prefix="lean_rl_gpu_smoke_"))
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    for step in steps:
        try:
            line = RUNNERS[step](args.device, out / step)
        except Exception as error:  # noqa: BLE001 - one line for the step, then the next step
            line = emit(step, ok=False, error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc()[-3000:])
        failed |= line.get("ok") is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
