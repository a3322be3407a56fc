"""Part (1) of the device check (issue 39): the trainer on CUDA, on a machine that has torch and the
wheels scripts/gpu-wheels.sh carries (megatron-core, numpy, packaging, safetensors) and nothing else:
no SGLang, no Ray, no transformers. One Megatron rank hosted in this process (gloo, world size 1),
built, trained and exported by lean_rl's own code.

    bash scripts/gpu-smoke.sh --trainer-only [--device cuda|cpu] [--out DIR]

Steps, one JSON line each, each with a deadline (SIGALRM) and its resources released in `finally`;
a last line `done` sums them up (and lists any of ray / sglang / transformers that got imported):
- env: torch, CUDA, the GPU and its driver, megatron-core, TransformerEngine's import error if any.
- reference: in a second process (a CPU Megatron rank patches torch.cuda process-wide), a bfloat16 tiny
  qwen2 checkpoint written from Megatron's seeded init, and TRAIN_STEPS GRPO steps on it in float32 on CPU.
- export: the checkpoint loaded into a bfloat16 trainer on the device (--bf16, local layer spec); its
  weights exported for sync as the engines take them
  (HF names, the engines' dtype, buckets of --update-weight-buffer-size): every tensor bit-equal to
  the checkpoint's.
- ipc: those buckets flattened on the device and sent to a second process (torch.multiprocessing:
  CUDA IPC handles on GPU, shared memory on CPU), which opens them and hashes every tensor: the
  hashes must equal this process's.
- train: the same TRAIN_STEPS GRPO steps (same checkpoint, same synthetic groups) in bfloat16 on the
  device: its log-probs agree with the float32 reference's within MEAN_LOGPROB_TOL before and after
  training, training moved both, every loss is finite.
- offload: the trained bfloat16 trainer offloaded and onloaded (colocated mode's turn), with
  torch.cuda.mem_get_info() at each phase; the weights bit-identical after; on GPU memory was freed.
- rng: a checkpoint saved (model, optimizer, RNG); the draws (python, numpy, torch, CUDA, Megatron's
  RNG tracker) after loading it repeat those right after saving.
On CPU (--device cpu) every step runs as on a GPU (CI: tests/integration/test_gpu_smoke.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from lean_rl.testing.gpu_smoke_parts import (RankTools, Smoke, bucket_hashes, deadline, emit, free_memory,
                                             open_in_child, reference_in_child, result, train_tiny)

TRAIN_STEPS = 3
# The probe's bfloat16 bound (weight_sync/config.py DEFAULT_PROBE_TOL): bf16 rounding against float32
MEAN_LOGPROB_TOL = 0.1
STEP_DEADLINE_S = {"env": 60, "reference": 180, "export": 90, "ipc": 90, "train": 120, "offload": 60, "rng": 90}
BUCKET_BYTES = 64 * 1024  # small buckets: several per model, as a real model has
FOREIGN = ("ray", "sglang", "transformers")  # must not be needed (nor imported) here

# ---------------------------------------------------------------------- steps
def step_env(smoke: Smoke) -> dict:
    import importlib
    import importlib.metadata
    import importlib.util
    import shutil
    import subprocess

    facts: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                             "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        if shutil.which("nvidia-smi"):
            facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=30).stdout.strip()
    for dist in ("megatron-core", "numpy", "safetensors"):
        try:
            facts[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            facts[dist] = None
    try:
        importlib.import_module("transformer_engine.pytorch")  # not installed where mypy runs
        facts["transformer_engine"] = "loads"
    except Exception as error:  # noqa: BLE001 - reported, not needed: the local spec trains here
        facts["transformer_engine"] = f"{type(error).__name__}: {str(error)[:200]}"
    facts["installed"] = {name: importlib.util.find_spec(name) is not None for name in FOREIGN}
    ok = (smoke.device == "cpu" or facts["cuda_available"]) and facts["megatron-core"] is not None
    return result("env", ok=ok, **facts)


def step_export(smoke: Smoke) -> dict:
    from safetensors.torch import load_file

    if smoke.checkpoint is None:
        return result("export", skipped="no checkpoint: the reference step did not run or failed")
    checkpoint = smoke.checkpoint
    expected = load_file(str(checkpoint / "model.safetensors"))
    group = smoke.group(smoke.device, "bfloat16")
    try:
        group.load_hf_checkpoint(checkpoint)
        group.attach(RankTools)
        buckets = group.call_all(RankTools.export_buckets, group.family, "bfloat16", BUCKET_BYTES)[0]
    finally:
        group.shutdown()
    smoke.buckets = buckets
    got = {}
    for bucket in buckets:
        offset, flat = 0, bucket["flat"]
        for name, shape, dtype in zip(bucket["names"], bucket["shapes"], bucket["dtypes"]):
            tensor_dtype = getattr(torch, dtype)
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=tensor_dtype).element_size()
            got[name] = flat[offset:offset + nbytes].view(tensor_dtype).reshape(shape)
            offset += nbytes
    differing = sorted(n for n in expected if n not in got or not torch.equal(got[n].cpu(), expected[n]))
    extra = sorted(set(got) - set(expected))
    return result("export", ok=not differing and not extra and len(got) == len(expected),
                tensors=len(got), buckets=len(buckets), dtypes=sorted({d for b in buckets for d in b["dtypes"]}),
                bucket_device=str(buckets[0]["flat"].device) if buckets else None,
                bytes=sum(int(b["flat"].numel()) for b in buckets), differing=differing[:8], unexpected=extra[:8])


def step_ipc(smoke: Smoke) -> dict:
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor

    if not smoke.buckets:
        return result("ipc", skipped="no buckets: the export step did not run or failed")
    expected = bucket_hashes(smoke.buckets)
    handle_kind = reduce_tensor(smoke.buckets[0]["flat"])[0].__name__  # rebuild_cuda_tensor on GPU
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    child = context.Process(target=open_in_child, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        inbox.put(smoke.buckets)
        answer = outbox.get(timeout=STEP_DEADLINE_S["ipc"] - 10)
        inbox.put("done")
        child.join(timeout=30)
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    differing = sorted(n for n in expected if answer["hashes"].get(n) != expected[n])
    return result("ipc", ok=not differing and answer["pid"] != os.getpid() and len(answer["hashes"]) == len(expected),
                handle=handle_kind, opened_on=answer["devices"], tensors=len(expected), differing=differing[:8],
                child_exit=child.exitcode)


def step_reference(smoke: Smoke) -> dict:
    """The checkpoint and the float32 CPU reference, in a second process (see reference_in_child)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    outbox = context.Queue()
    child = context.Process(target=reference_in_child, args=(str(smoke.out), TRAIN_STEPS, outbox), daemon=True)
    child.start()
    try:
        answer = outbox.get(timeout=STEP_DEADLINE_S["reference"] - 10)
        child.join(timeout=30)
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    if "error" in answer:
        return result("reference", ok=False, error=answer["error"], traceback=answer["traceback"])
    smoke.checkpoint, smoke.reference = Path(answer["checkpoint"]), answer
    return result("reference", ok=True, checkpoint=answer["checkpoint"], pg_loss_fp32=answer["pg_loss"],
                  grad_norm_fp32=answer["grad_norm"], child_pid=answer["pid"], child_exit=child.exitcode)


def step_train(smoke: Smoke) -> dict:
    if smoke.reference is None or smoke.checkpoint is None:
        return result("train", skipped="no float32 reference: the reference step did not run or failed")
    reference = smoke.reference
    smoke.trained, before, after, metrics = train_tiny(smoke, smoke.device, "bfloat16", TRAIN_STEPS)
    ref_before, ref_after = torch.tensor(reference["before"]), torch.tensor(reference["after"])
    gap_before = float((before - ref_before).abs().mean())
    gap_after = float((after - ref_after).abs().mean())
    moved = float((after - before).abs().max()), float((ref_after - ref_before).abs().max())
    losses = [m["train/pg_loss"] for m in metrics] + reference["pg_loss"]
    finite = all(torch.isfinite(torch.tensor(x)) for x in losses)
    return result("train", ok=bool(gap_before <= MEAN_LOGPROB_TOL and gap_after <= MEAN_LOGPROB_TOL and min(moved) > 0
                                 and finite),
                  steps=TRAIN_STEPS, tolerance_mean_abs_logprob=MEAN_LOGPROB_TOL,
                  mean_abs_logprob_gap_before=gap_before, mean_abs_logprob_gap_after=gap_after,
                  max_abs_logprob_moved_bf16=moved[0], max_abs_logprob_moved_fp32=moved[1],
                  pg_loss_bf16=[m["train/pg_loss"] for m in metrics], pg_loss_fp32=reference["pg_loss"],
                  grad_norm_bf16=[m["train/grad_norm"] for m in metrics], grad_norm_fp32=reference["grad_norm"])


def step_offload(smoke: Smoke) -> dict:
    if smoke.trained is None:
        return result("offload", skipped="no trained group: the train step did not run or failed")
    group, device = smoke.trained, smoke.device
    before = group.gather_hf_state_dict()
    free = {"trained": free_memory(device)}
    offload = group.offload()
    free["offloaded"] = free_memory(device)
    onload = group.onload()
    free["onloaded"] = free_memory(device)
    after = group.gather_hf_state_dict()
    identical = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    freed = None if device != "cuda" else free["offloaded"] - free["trained"]
    ok = identical and (device != "cuda" or (offload.get("offloaded") and freed > 0 and onload.get("onloaded")))
    return result("offload", ok=bool(ok), free_bytes=free, freed_bytes=freed, offload=offload, onload=onload,
                weights_identical_after_onload=identical)


def step_rng(smoke: Smoke) -> dict:
    if smoke.trained is None:
        return result("rng", skipped="no trained group: the train step did not run or failed")
    group = smoke.trained
    group.attach(RankTools)
    root = smoke.out / "rng_checkpoint"
    group.save_checkpoint(root, TRAIN_STEPS)
    saved = group.call_all(RankTools.draws)[0]
    step, _ = group.load_checkpoint(root)
    loaded = group.call_all(RankTools.draws)[0]
    again = group.call_all(RankTools.draws)[0]
    return result("rng", ok=saved == loaded and loaded != again and step == TRAIN_STEPS, streams=sorted(saved),
                repeated=saved == loaded, loaded_step=step)


STEPS: dict[str, Callable[[Smoke], dict]] = {"env": step_env, "reference": step_reference, "export": step_export,
                                             "ipc": step_ipc,
                                             "train": step_train, "offload": step_offload, "rng": step_rng}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-smoke.sh --trainer-only", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="lean_rl_gpu_smoke_trainer_"))
    out.mkdir(parents=True, exist_ok=True)
    smoke, failed, started = Smoke(args.device, out), [], time.perf_counter()
    try:
        for name, run in STEPS.items():
            step_started = time.perf_counter()
            try:
                with deadline(STEP_DEADLINE_S[name], name):
                    fields = run(smoke)
            except Exception as error:  # noqa: BLE001 - one line for the step, then the next step
                fields = result(name, ok=False, error=f"{type(error).__name__}: {error}",
                                traceback=traceback.format_exc()[-3000:])
            line = emit(**fields, seconds=round(time.perf_counter() - step_started, 2))
            if line.get("ok") is False:
                failed.append(name)
    finally:
        smoke.close()
    imported = sorted(name for name in FOREIGN if name in sys.modules)
    emit("done", ok=not failed and not imported, failed=failed, imported=imported, device=args.device,
         seconds=time.perf_counter() - started)
    return 1 if failed or imported else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
