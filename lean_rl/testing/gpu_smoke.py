"""Part (2) of the device check (issue 39): the engine side, for a machine with the full GPU environment
(SGLang's GPU build, Ray, TransformerEngine optional: scripts/setup.sh), what a user runs first. Part (1),
the trainer alone on a machine with torch and a few wheels, is gpu_smoke_trainer.py (--trainer-only).

    bash scripts/gpu-smoke.sh --steps env,engine,memory,disk,corrupt   # call 1 (< 7 min on one GPU)
    bash scripts/gpu-smoke.sh --steps lora,loop                        # call 2 (< 7 min)

Every step prints one JSON line, runs under a deadline (SIGALRM) and releases what it started in
`finally`; steps needing what is missing print {"skipped": why}. A bfloat16 tiny qwen2 model throughout
(16-bit engines are the GPU default, review 2026-12-06 N1). The steps engine..corrupt share one
colocated set, built as a run builds it (the trainer offloaded before the engines start: N5) and torn
down (engines, trainer, Ray) before lora and at the end:
- env: driver, torch's CUDA, nvcc / CUDA_HOME, TransformerEngine's import error, sgl_kernel,
  torch_memory_saver, flashinfer, the GPU count (the disaggregated NCCL path needs >= 2: not covered).
- engine: one colocated bf16 engine (--enable-memory-saver) and a bf16 trainer; the first sync as the
  run makes it (engines release, trainer onloads, CUDA IPC, trainer offloads, KV cache back, probe).
- memory: a second turn with torch.cuda.mem_get_info() at each phase (released, onloaded, sent,
  offloaded, KV back) and a /health while released (M1-M5).
- disk: a sync by the disk transport (auto's fallback on GPU) to the same engine, probed.
- corrupt: one tensor of the engine overwritten with zeros; the probe must fail and name it (W2).
- lora: `lean_rl.train --colocate --lora-rank 4 --transformer-impl local`, one rollout (N2).
- loop: `lean_rl.train --colocate --num-rollout 2` (one full loop).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from lean_rl.testing.gpu_smoke_colocated import Colocated, bf16_tiny_model
from lean_rl.testing.gpu_smoke_parts import deadline, emit, free_memory, result

STEPS = ("env", "engine", "memory", "disk", "corrupt", "lora", "loop")
# engine: a cold first start on GPU compiles kernels (N7); its own timeout (gpu_smoke_colocated) comes first
STEP_DEADLINE_S = {"env": 60, "engine": 420, "memory": 120, "disk": 120, "corrupt": 120, "lora": 360, "loop": 360}
CORRUPTED = "model.layers.1.mlp.down_proj.weight"  # zeroed on the engine by the corrupt step
CORRUPT_VERSION = 99


def missing(*modules: str) -> str | None:
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(absent)}" if absent else None


class Run:
    def __init__(self, device: str, out: Path):
        self.device, self.out = device, out
        self.colocated: Colocated | None = None

    def shared(self) -> Colocated:
        colocated = self.colocated
        if colocated is None:
            colocated = self.colocated = Colocated(self.device, self.out / "colocated")
        return colocated

    def close(self) -> None:
        if self.colocated is not None:
            colocated, self.colocated = self.colocated, None
            colocated.close()


def step_env(run: Run) -> dict:
    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
             "gpus": torch.cuda.device_count(), "nvcc": shutil.which("nvcc"), "CUDA_HOME": os.environ.get("CUDA_HOME")}
    if shutil.which("nvidia-smi"):
        facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=30).stdout.strip()
    for name in ("transformer_engine.pytorch", "sgl_kernel", "torch_memory_saver", "flashinfer", "sglang", "ray"):
        try:
            __import__(name)
            facts[name] = "loads"
        except Exception as error:  # noqa: BLE001 - the facts are the point
            facts[name] = f"{type(error).__name__}: {str(error)[:200]}"
    facts["disaggregated"] = ("not covered: the NCCL path needs >= 2 GPUs (trainer rank and engine on one GPU in one "
                              "NCCL group is refused)")
    return result("env", ok=run.device == "cpu" or facts["cuda_available"], **facts)


def probed(report):
    """The probe of a sync run with probe=True (the default): its ProbeResult."""
    if report.probe is None:
        raise RuntimeError("the sync ran without its probe")
    return report.probe


def _needs_gpu_stack(run: Run, gpu_only: bool = True) -> str | None:
    """Why a step cannot run here, or None. `gpu_only`: it checks what only a GPU does (memory release,
    CUDA IPC); the others run on CPU too (engine, disk: CPU SGLang, the inline tensor payload)."""
    gpu = None if run.device == "cuda" or not gpu_only else "releases memory / opens CUDA IPC on GPU only"
    return missing("sglang", "ray", "megatron") or gpu


def step_engine(run: Run) -> dict:
    if (reason := _needs_gpu_stack(run, gpu_only=False)):
        return result("engine", skipped=reason)
    colocated = run.shared()
    probe = probed(colocated.turn_and_sync(0))  # as the run's start-up sync
    return result("engine", ok=probe.mean_abs_diff <= probe.tolerance, transport=colocated.cfg.transport,
                  probe_mean=probe.mean_abs_diff, probe_max=probe.max_abs_diff, tolerance=probe.tolerance,
                  statistic=probe.statistic,
                  free_bytes_when_engines_started=colocated.free_with_trainer_offloaded)


def step_memory(run: Run) -> dict:
    import httpx

    if (reason := _needs_gpu_stack(run)):
        return result("memory", skipped=reason)
    colocated = run.shared()
    colocated.phases = {"generating": free_memory(run.device)}
    health = {}

    def check_health():  # /health must not generate on released memory (M3)
        health["status"] = httpx.get(f"{colocated.engines.engine_urls[0]}/health",  # needs no key
                                     timeout=30).status_code

    try:
        probe = probed(colocated.turn_and_sync(1, on_released=check_health))
        phases = colocated.phases or {}
    finally:
        colocated.phases = None
    alive = colocated.engines.engine_alive(0)
    ok = alive and probe.mean_abs_diff <= probe.tolerance and phases["released"] > phases["generating"]
    return result("memory", ok=bool(ok), free_bytes=phases, health_while_released=health.get("status"),
                  engine_alive=alive, probe_mean=probe.mean_abs_diff)


def step_disk(run: Run) -> dict:
    from lean_rl.options import build
    from lean_rl.weight_sync.config import WeightSyncConfig
    from lean_rl.weight_sync.sync import WeightSync

    if (reason := _needs_gpu_stack(run, gpu_only=False)):
        return result("disk", skipped=reason)
    colocated = run.shared()
    colocated.trainer.onload()
    try:
        with WeightSync.create(build(WeightSyncConfig, transport="disk", colocate=True, device=run.device),
                               colocated.trainer, colocated.engines.engine_urls, api_key=colocated.config.api_key,
                               tokenizer_path=str(colocated.model)) as sync:
            report = sync.update(2)
    finally:
        colocated.trainer.offload()
    probe = probed(report)
    return result("disk", ok=probe.mean_abs_diff <= probe.tolerance, bytes=report.bytes,
                  sync_seconds=report.seconds, probe_mean=probe.mean_abs_diff)


def step_corrupt(run: Run) -> dict:
    import torch

    from lean_rl.backends.sglang.client import EngineClient
    from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
    from lean_rl.backends.sglang.compat import patch_torch_cuda_ipc_reductions
    from lean_rl.weight_sync.buckets import Bucket
    from lean_rl.weight_sync.errors import WeightSyncProbeError
    from lean_rl.weight_sync.transports.tensor import cuda_ipc_bucket, cuda_ipc_payloads

    if (reason := _needs_gpu_stack(run)):
        return result("corrupt", skipped=reason)
    colocated = run.shared()
    colocated.trainer.onload()
    try:
        shape = colocated.trainer.gather_hf_state_dict()[CORRUPTED].shape
        patch_torch_cuda_ipc_reductions()
        bucket = Bucket()
        bucket.add(CORRUPTED, torch.zeros(shape, dtype=torch.bfloat16, device="cuda"))
        flat = cuda_ipc_bucket(bucket)
        url = colocated.engines.engine_urls[0]
        with BlockingEngineClient(url, timeout_s=120, api_key=colocated.config.api_key) as client:
            client.submit(EngineClient.update_weights_from_tensor, cuda_ipc_payloads(flat, 1),
                          weight_version=str(CORRUPT_VERSION), flush_cache=True,
                          load_format="flattened_bucket").result(timeout=120)
        del flat
        try:
            colocated.weights.probe(CORRUPT_VERSION)
            caught, named = None, []
        except WeightSyncProbeError as error:
            caught, named = str(error)[:600], list(error.tensors or [])
    finally:
        colocated.trainer.offload()
    return result("corrupt", ok=caught is not None and any(CORRUPTED in n or "down_proj" in n for n in named),
                  error=caught, named=named)


def _train_command(run: Run, out: Path, *extra: str) -> dict:
    from lean_rl.testing.toy_task import write_dataset

    run.close()  # the GPU for this run alone
    model = bf16_tiny_model(out)
    write_dataset(out / "train.jsonl", 64, seed=0)
    cmd = [sys.executable, "-m", "lean_rl.train", "--hf-checkpoint", str(model), "--prompt-data",
           str(out / "train.jsonl"), "--custom-rm-path", "lean_rl.testing.toy_task.kind_fraction_reward",
           "--colocate", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len",
           "12", "--micro-batch-size", "8", "--output-dir", str(out / "run"), "--no-tensorboard",
           "--sglang-max-total-tokens", "8192", *extra]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=STEP_DEADLINE_S["loop"] - 40)
    finally:
        if proc.poll() is None:  # SIGTERM first: the run stops its engines and Ray (lean_rl/stop.py)
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    metrics = out / "run" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    return {"returncode": proc.returncode, "rows": len(rows), "run_seconds": time.perf_counter() - started,
            "probe": [r.get("sync/probe_mean_abs_diff") for r in rows],
            "tail": None if proc.returncode == 0 else stderr[-2000:]}


def step_lora(run: Run) -> dict:
    if (reason := _needs_gpu_stack(run, gpu_only=False)):
        return result("lora", skipped=reason)
    got = _train_command(run, run.out / "lora", "--num-rollout", "1", "--lora-rank", "4", "--transformer-impl", "local")
    return result("lora", ok=got["returncode"] == 0 and got["rows"] == 1, **got)


def step_loop(run: Run) -> dict:
    if (reason := _needs_gpu_stack(run, gpu_only=False)):
        return result("loop", skipped=reason)
    got = _train_command(run, run.out / "loop", "--num-rollout", "2")
    return result("loop", ok=got["returncode"] == 0 and got["rows"] == 2, **got)


RUNNERS = {"env": step_env, "engine": step_engine, "memory": step_memory, "disk": step_disk,
           "corrupt": step_corrupt, "lora": step_lora, "loop": step_loop}


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
    out = Path(args.out or tempfile.mkdtemp(prefix="lean_rl_gpu_smoke_"))
    out.mkdir(parents=True, exist_ok=True)
    run, failed = Run(args.device, out), False
    try:
        for step in steps:
            started = time.perf_counter()
            try:
                with deadline(STEP_DEADLINE_S[step], step):
                    fields = RUNNERS[step](run)
            except Exception as error:  # noqa: BLE001 - one line for the step, then the next step
                fields = result(step, ok=False, error=f"{type(error).__name__}: {error}",
                                traceback=traceback.format_exc()[-3000:])
            failed |= emit(**fields, seconds=round(time.perf_counter() - started, 2)).get("ok") is False
    finally:
        run.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
