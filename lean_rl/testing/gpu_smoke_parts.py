"""The pieces of the trainer-only device check (gpu_smoke_trainer.py): the tiny checkpoint it writes,
what it hosts on the Megatron rank (the weight sync's export, RNG draws), the second process that
opens the shared buckets, a step's deadline. torch and megatron-core only: no Ray, SGLang or
transformers (the check fails when any of them gets imported)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import traceback
from pathlib import Path
from typing import Any

import torch

# A qwen2 model small enough for CPU CI; an HF config.json's keys (hf_config.arch_from_hf_config)
TINY_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "use_sliding_window": False, "dtype": "bfloat16"}


def result(step: str, **fields) -> dict:
    """A step's line, printed by main with the step's seconds."""
    return {"step": step, **fields}


def emit(step: str, **fields) -> dict:
    line = {"step": step, **fields}
    print(json.dumps(line, default=str), flush=True)
    return line


@contextlib.contextmanager
def deadline(seconds: int, what: str):
    """TimeoutError in this (main) thread after `seconds` (checked between Python bytecodes)."""
    def expired(signum, frame):
        raise TimeoutError(f"{what}: deadline of {seconds} s passed")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def free_memory(device: str) -> int | None:
    """Bytes free on the GPU (torch.cuda.mem_get_info), None on CPU."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


class Smoke:
    """What the steps share: the device, the work directory, the checkpoint, the trained group."""

    def __init__(self, device: str, out: Path):
        self.device, self.out = device, out
        self.checkpoint: Path | None = None
        self.buckets: list[dict] = []  # from export, for ipc
        self.trained = None  # the bfloat16 MegatronGroup after train, for offload and rng
        self.reference: dict | None = None  # the float32 CPU reference (reference_in_child's answer)

    def close(self) -> None:
        self.buckets = []
        if self.trained is not None:
            self.trained.shutdown()
            self.trained = None

    # ------------------------------------------------------------------ helpers
    def group(self, device: str, dtype: str, seed: int = 1234):
        from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
        from lean_rl.backends.megatron.group import MegatronGroup
        from lean_rl.backends.megatron.hf_config import arch_from_hf_config

        config = MegatronConfig(arch=arch_from_hf_config(TINY_QWEN2), parallel=ParallelConfig(), params_dtype=dtype,
                                transformer_impl="local")
        return MegatronGroup(config, world_size=1, device=device, in_process=True, seed=seed)

    def write_checkpoint(self) -> Path:
        """A bfloat16 HF checkpoint (config.json + model.safetensors) of Megatron's seeded random init,
        exported by lean_rl's HF export; no transformers needed."""
        from safetensors.torch import save_file

        if self.checkpoint is not None:
            return self.checkpoint
        path = self.out / "tiny_qwen2_bf16"
        path.mkdir(parents=True, exist_ok=True)
        group = self.group("cpu", "float32", seed=7)
        try:
            group.family = "qwen2"  # what load_hf_checkpoint would set: the export's name table
            state = {k: v.to(torch.bfloat16).contiguous() for k, v in group.gather_hf_state_dict().items()}
        finally:
            group.shutdown()
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        (path / "config.json").write_text(json.dumps(TINY_QWEN2, indent=1))
        self.checkpoint = path
        return path


class RankTools:
    """Hosted on the rank (MegatronRank.attach): the export as the weight sync makes it, and RNG draws."""

    def __init__(self, worker):
        self.worker = worker

    def export_buckets(self, family: str, engine_dtype: str, bucket_bytes: int) -> list[dict]:
        from lean_rl.weight_sync.buckets import iter_buckets
        from lean_rl.weight_sync.rank import in_dtype

        tensors = in_dtype(self.worker.named_hf_tensors(family), engine_dtype)
        return [{"names": list(b.names), "shapes": b.shapes(), "dtypes": b.dtype_names(), "flat": b.flatten()}
                for b, _ in iter_buckets(tensors, bucket_bytes)]

    def draws(self) -> dict[str, Any]:
        import random

        import numpy as np
        from megatron.core import tensor_parallel

        out = {"python": random.random(), "numpy": float(np.random.rand()), "torch": torch.rand(3).tolist()}
        if self.worker.device.type == "cuda":
            out["cuda"] = torch.rand(3, device=self.worker.device).tolist()
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out["tracker"] = torch.rand(3, device=self.worker.device).tolist()
        return out


def bucket_hashes(buckets: list[dict]) -> dict[str, str]:
    """sha256 of every tensor's bytes inside its flat bucket (the layout SGLang's flattened_bucket reads)."""
    hashes = {}
    for bucket in buckets:
        offset, flat = 0, bucket["flat"]
        for name, shape, dtype in zip(bucket["names"], bucket["shapes"], bucket["dtypes"]):
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=getattr(torch, dtype)).element_size()
            hashes[name] = hashlib.sha256(flat[offset:offset + nbytes].cpu().numpy().tobytes()).hexdigest()
            offset += nbytes
    return hashes


def open_in_child(inbox, outbox) -> None:
    """The second process: open the shared buckets (CUDA IPC handles on GPU) and hash their tensors."""
    buckets = inbox.get(timeout=60)
    outbox.put({"devices": sorted({str(b["flat"].device) for b in buckets}), "hashes": bucket_hashes(buckets),
                "pid": os.getpid()})
    inbox.get(timeout=60)  # the parent has read the answer: the shared memory may go


def eval_tokens() -> list[list[int]]:
    """The sequences whose log-probs the device run and the reference compare."""
    from lean_rl.testing.sample_groups import make_groups

    return [s.tokens for g in make_groups(seed=99) for s in g][:4]


def train_tiny(smoke: Smoke, device: str, dtype: str, steps: int):
    """A group of the checkpoint on `device` in `dtype`, trained `steps` GRPO steps on fixed synthetic
    groups: (group, log-probs of eval_tokens() before, after, each step's metrics). The group is the
    caller's to shut down (shut down here on failure)."""
    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.backends.megatron.train_config import BatchConfig, CheckpointConfig, OptimizerConfig, TrainConfig
    from lean_rl.backends.megatron.train_driver import train_on_rollout
    from lean_rl.backends.megatron.trainer_init import initialize_for_training
    from lean_rl.options import build
    from lean_rl.testing.sample_groups import make_groups, set_rollout_log_probs

    group = smoke.group(device, dtype)
    try:
        group.load_hf_checkpoint(smoke.checkpoint)
        train = TrainConfig(optimizer=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=2),
                            checkpoint=CheckpointConfig(hf_checkpoint=str(smoke.checkpoint)))
        initialize_for_training(group, train, build(AlgorithmConfig, use_rollout_logprobs=True))
        before = torch.cat(group.compute_log_probs(eval_tokens()).log_probs).double().cpu()
        metrics = []
        for step in range(steps):
            groups = make_groups(seed=100 + step)
            set_rollout_log_probs(group, groups)
            metrics.append(train_on_rollout(group, groups, policy_version=step))
        after = torch.cat(group.compute_log_probs(eval_tokens()).log_probs).double().cpu()
    except BaseException:
        group.shutdown()
        raise
    return group, before, after, metrics


def reference_in_child(out_dir: str, steps: int, outbox) -> None:
    """The second process of the reference step: the checkpoint, then the float32 CPU reference. Apart
    from the device run because a CPU Megatron rank replaces torch.cuda's API and Megatron's RNG tracker
    process-wide (backends/megatron/compat_cpu.py apply_cpu_fixes): a GPU rank after it would break."""
    try:
        smoke = Smoke("cpu", Path(out_dir))
        checkpoint = smoke.write_checkpoint()
        group, before, after, metrics = train_tiny(smoke, "cpu", "float32", steps)
        group.shutdown()
        outbox.put({"checkpoint": str(checkpoint), "before": before.tolist(), "after": after.tolist(),
                    "pg_loss": [m["train/pg_loss"] for m in metrics],
                    "grad_norm": [m["train/grad_norm"] for m in metrics],
                    "pid": os.getpid()})
    except BaseException as error:  # noqa: BLE001 - the parent reports it as the step's error
        outbox.put({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]})
