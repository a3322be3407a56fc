"""Real Megatron ranks for the vision-language tests and the VLM checkpoint converter: `run_ranks` starts
`world_size` processes (spawn, gloo on CPU), each initialises torch.distributed + parallel_state as a
trainer rank does, builds VisionLanguageModel from an HF checkpoint and runs `job(model, config)`; rank
0's return value comes back. No Ray: these ranks own nothing but the model."""

from __future__ import annotations

import io
import queue as queue_module
import socket
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.vlm_local import Job, run_vlm_rank


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, world_size: int, port: int, parallel: ParallelConfig, checkpoint: str,
               divisible_by: int, freeze_vision_tower: bool, load_hf: bool, job: Job, results) -> None:
    try:
        torch.set_num_threads(1)
        value = run_vlm_rank(job, checkpoint, rank=rank, world_size=world_size, port=port, parallel=parallel,
                             divisible_by=divisible_by, freeze_vision_tower=freeze_vision_tower, load_hf=load_hf)
        # bytes, not tensors: torch's queue pickler hands tensors over as fds of a process about to exit
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(checkpoint: str | Path, job: Job, parallel: ParallelConfig = ParallelConfig(),
              divisible_by: int = 128, freeze_vision_tower: bool = False, load_hf: bool = True,
              timeout_s: float = 300.0) -> Any:
    """`job(model, config)` on every rank of a fresh group; rank 0's result. A rank's exception is raised
    here with its traceback; ranks that outlive `timeout_s` are killed."""
    world = parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, world, port, parallel, str(checkpoint), divisible_by,
                                                   freeze_vision_tower, load_hf, job, results), daemon=True)
             for rank in range(world)]
    for proc in procs:
        proc.start()
    try:
        outcome: dict[int, tuple[str, Any]] = {}
        while len(outcome) < world:
            try:
                rank, status, value = results.get(timeout=timeout_s)
            except queue_module.Empty:
                raise TimeoutError(f"VLM ranks gave no result within {timeout_s}s") from None
            outcome[rank] = (status, value)
            if status == "error":
                raise RuntimeError(f"VLM rank {rank} failed:\n{value}")
        return torch.load(io.BytesIO(outcome[0][1]), weights_only=False)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def log_probs_job(tokens: torch.Tensor, per_row: list, model, config: MegatronConfig) -> torch.Tensor | None:
    """[b, s-1] float32 log p(tokens[:, 1:]) on rank 0 (the last stage; PP 1 here), None elsewhere."""
    from megatron.core import parallel_state

    from lean_rl.backends.megatron.logprobs import vocab_parallel_log_probs
    from lean_rl.backends.megatron.vlm_batch import stack_image_inputs

    merge = int(model.hf_config["vision_config"]["spatial_merge_size"])
    model.set_images(stack_image_inputs(per_row, tokens, model.image_token_id, merge))
    with torch.no_grad():
        logits = model(tokens, None)
    log_probs, _ = vocab_parallel_log_probs(logits[:, :-1], tokens[:, 1:], config.arch.vocab_size)
    return log_probs if parallel_state.get_tensor_model_parallel_rank() == 0 else None


def gather_job(model, config: MegatronConfig) -> dict | None:
    from lean_rl.backends.megatron.vlm_weights import gather_vlm_hf_state_dict

    return gather_vlm_hf_state_dict(model, config)


def train_job(tokens: torch.Tensor, per_row: list, loss_from: int, steps: int, model,
              config: MegatronConfig) -> dict:
    """`steps` Adam steps minimising -mean log p(tokens[:, loss_from:]) on one fixed batch with images
    (TP 1: no gradient reduction needed). Returns the losses and how far the tower and the LM moved."""
    from lean_rl.backends.megatron.logprobs import vocab_parallel_log_probs
    from lean_rl.backends.megatron.vlm_batch import stack_image_inputs

    merge = int(model.hf_config["vision_config"]["spatial_merge_size"])
    images = stack_image_inputs(per_row, tokens, model.image_token_id, merge)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        model.set_images(images)
        logits = model(tokens, None)
        log_probs, _ = vocab_parallel_log_probs(logits[:, :-1], tokens[:, 1:], config.arch.vocab_size)
        loss = -log_probs[:, loss_from - 1:].mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))

    def moved(prefix: str) -> float:
        return max(float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()
                   if n.startswith(prefix))

    vision_grads = [p.grad for p in model.vision_model.parameters()]
    return {"losses": losses, "vision_moved": moved("vision_model."), "language_moved": moved("language_model."),
            "vision_has_grad": any(g is not None and bool(g.abs().sum() > 0) for g in vision_grads)}


def load_and_gather_job(megatron_dir: str, model, config: MegatronConfig) -> dict | None:
    """Load a Megatron checkpoint of the VLM (resharded to this layout) and gather its HF tensors."""
    from lean_rl.backends.megatron.model_checkpoint import load_model_checkpoint

    load_model_checkpoint(model, megatron_dir, vocab_size=config.arch.vocab_size)  # any vocab padding
    return gather_job(model, config)
