"""torch_dist checkpoints of one rank's model, optimizer, LR scheduler, RNG and trainer counters,
plus the driver's extra state (the DataBuffer's state_dict, as JSON), in checkpoint_paths' layout.

Save (all ranks in lockstep): rank 0 repairs what an earlier crashed save left and prepares
ROOT/iter_N.tmp, every rank writes its shards with dist_checkpointing.save, rank 0 adds
extra_state.json, and only after a barrier rank 0 publishes it (checkpoint_paths.publish: fsync of
every file, rename into place, atomic tracker update; a kill -9 at any point leaves a loadable
checkpoint for the tracker), then with keep_last deletes all but the newest keep_last iterations.

Load: model shards reshard to any TP / PP / EP layout; optimizer state is loaded when the checkpoint
has it (a model-only checkpoint, e.g. from tools/convert_ckpt, starts a fresh optimizer) with
is_loading=True, without which Megatron restores nothing and says nothing. Distributed-optimizer
state is saved `fully_reshardable` (the default format cannot be written here: "flattened_range is
not supported"). RNG state is per rank, so it is restored only into the same layout."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

from lean_rl.backends.megatron import checkpoint_paths, lora
from lean_rl.backends.megatron.hf_weights.dist_keys import EXTRA_STATE
from lean_rl.backends.megatron.model_checkpoint import adapt_model_request, read_checkpoint_metadata

EXTRA_STATE_FILE = "extra_state.json"
FORMAT_VERSION = 1
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}


def _layout() -> list[int]:
    return [dist.get_world_size(), parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size()]


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def rng_state_fits(meta: dict[str, Any], layout: list[int], device_type: str) -> bool:
    """Whether a checkpoint's RNG states can be restored here: saved by the same parallel layout on the
    same kind of device. The tracker keeps CPU generator states on CPU (compat) and CUDA ones on GPU,
    so a CPU checkpoint's states in a GPU run crash the first fork() (review W3); then the run keeps its
    fresh seeds. Checkpoints written before the device was recorded all came from CPU runs."""
    return meta.get("layout") == layout and meta.get("device", "cpu") == device_type


def _rng_object(device: torch.device) -> ShardedObject:
    return ShardedObject("lean_rl_rng_state", _rng_state(device), (dist.get_world_size(),), (dist.get_rank(),),
                         replica_id=0)


def has_optimizer_state(checkpoint_dir: Path) -> bool:
    return any("optimizer.state." in key for key in dist_checkpointing.load_tensors_metadata(str(checkpoint_dir)))


def save_checkpoint(model: torch.nn.Module, optimizer, scheduler, trainer_state: dict[str, Any], root: str | Path,
                    step: int, extra_state: dict[str, Any] | None, device: torch.device,
                    keep_last: int | None = None) -> Path:
    """Write step `step` under `root`; returns the published directory (on every rank). `keep_last`:
    then delete all but the newest `keep_last` iterations under `root` (never the tracker's)."""
    rank = dist.get_rank()
    tmp = checkpoint_paths.temporary_dir(root, step)
    if rank == 0:
        checkpoint_paths.prepare_temporary_dir(root, step)
    dist.barrier()
    model_state = model.sharded_state_dict()
    state = {
        "model": model_state,
        "optimizer": optimizer.sharded_state_dict(model_state, metadata=OPTIMIZER_METADATA),
        "rng_state": _rng_object(device),
        "lean_rl": {"format": FORMAT_VERSION, "step": step, "scheduler": scheduler.state_dict(),
                    "trainer_state": dict(trainer_state), "layout": _layout(), "device": device.type},
    }
    dist_checkpointing.save(state, str(tmp))
    if rank == 0:
        (tmp / EXTRA_STATE_FILE).write_text(json.dumps(extra_state if extra_state is not None else {}))
    dist.barrier()  # every rank's shards are on disk
    if rank == 0:
        checkpoint_paths.publish(root, step, tmp)
        if keep_last is not None:
            checkpoint_paths.prune(root, keep_last)
    dist.barrier()
    return checkpoint_paths.iteration_dir(root, step)


def load_checkpoint(model: torch.nn.Module, optimizer, scheduler, root: str | Path, device: torch.device, *,
                    vocab_size: int, load_optimizer: bool = True, load_rng: bool = True,
                    step: int | None = None) -> dict[str, Any]:
    """Restore the latest checkpoint under `root` (that of `step` when given). Returns {"step",
    "extra_state", "trainer_state", "loaded_optimizer", "loaded_rng"}."""
    step, directory = checkpoint_paths.find_checkpoint(root, step)
    common = dist_checkpointing.load_common_state_dict(str(directory))
    meta = common.get("lean_rl", {})
    if step is None:  # `root` named one torch_dist directory without an iter_N name
        step = meta.get("step", 0)
    with_optimizer = load_optimizer and optimizer is not None and has_optimizer_state(directory)
    with_rng = load_rng and rng_state_fits(meta, _layout(), device.type)
    # the same tolerance as model-only checkpoints (vocab padding of another TP, the other layer
    # spec's key for the MoE pre-MLP norm, absent _extra_state): converted checkpoints load too
    model_state = adapt_model_request(model.sharded_state_dict(), read_checkpoint_metadata(directory), vocab_size,
                                      source=directory)
    state: dict[str, Any] = {"model": model_state}
    if with_optimizer:
        state["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=True, metadata=OPTIMIZER_METADATA)
    if with_rng:
        state["rng_state"] = _rng_object(device)
    loaded = dist_checkpointing.load(state, str(directory))
    missing, unexpected = model.load_state_dict(loaded["model"], strict=False)
    wrong = [k for k in [*lora.after_load(model, missing), *unexpected] if not k.endswith(EXTRA_STATE)]
    if wrong:
        raise RuntimeError(f"{directory}: model state does not match the checkpoint: {', '.join(wrong[:6])}")
    if with_optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
        if scheduler is not None and "scheduler" in meta:
            scheduler.load_state_dict(meta["scheduler"])
    if with_rng:
        _set_rng_state(loaded["rng_state"], device)
    extra_file = directory / EXTRA_STATE_FILE
    return {"step": step, "extra_state": json.loads(extra_file.read_text()) if extra_file.is_file() else None,
            "trainer_state": meta.get("trainer_state", {}), "loaded_optimizer": with_optimizer,
            "loaded_rng": with_rng}
