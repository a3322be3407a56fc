"""Megatron DDP + Megatron optimizer + LR scheduler for one rank's model (rank side).

Megatron's DDP keeps gradients in contiguous buffers (param.main_grad) and reduces them over data
parallel ranks in finalize_model_grads at the end of forward_backward_func; get_megatron_optimizer
builds Adam (one optimizer for dense and one for expert params, chained) with Megatron's weight-decay
grouping (no decay for biases and norms); OptimizerParamScheduler sets the LR before every step.

Mixed precision (--bf16 / --fp16, the model built in that dtype): Megatron's optimizer keeps float32
master copies of the 16-bit weights (Float16OptimizerWithFloat16Params, or float32 shards in the
distributed optimizer), steps them from the float32 gradient buffers, and copies them back. fp16
adds dynamic loss scaling: the schedule multiplies each loss by the scale (config.grad_scale_func),
and a step whose scaled gradients overflow is refused by optimizer.step() and the scale halved."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from lean_rl.backends.megatron.train_config import OptimizerConfig


@dataclass
class OptimizerBundle:
    ddp: DistributedDataParallel
    optimizer: object  # MegatronOptimizer (ChainedOptimizer when there are expert params)
    scheduler: OptimizerParamScheduler


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig, lr: float, pipeline_parallel: bool) -> OptimizerBundle:
    """Wrap `model` (this rank's GPTModel) and build its optimizer. `lr` overrides cfg.lr (critic)."""
    config = model.config  # Megatron's TransformerConfig: the schedule reads these hooks from it
    params_dtype = config.params_dtype  # model.transformer_config: float32, or 16-bit with --bf16 / --fp16
    ddp = DistributedDataParallel(
        config=config,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=cfg.use_distributed_optimizer,
            check_for_nan_in_grad=False),  # a non-finite step is skipped and counted, not raised
        module=model)
    optimizer = get_megatron_optimizer(
        MegatronOptimizerConfig(
            optimizer="adam", lr=lr, min_lr=min(cfg.min_lr, lr), weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps,
            clip_grad=cfg.clip_grad, bf16=params_dtype == torch.bfloat16, fp16=params_dtype == torch.float16,
            params_dtype=params_dtype, use_distributed_optimizer=cfg.use_distributed_optimizer,
            # fp16: Megatron's dynamic scaler from 2**16, not its 2**32, whose first dozens of steps
            # (halved every 2nd overflow) an RL run of a few hundred steps cannot afford
            initial_loss_scale=2.0**16),
        [ddp])
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=min(cfg.lr_warmup_init, lr), max_lr=lr, min_lr=min(cfg.min_lr, lr),
        lr_warmup_steps=cfg.lr_warmup_iters, lr_decay_steps=cfg.scheduler_decay_iters,
        lr_decay_style=cfg.lr_decay_style, start_wd=cfg.weight_decay, end_wd=cfg.weight_decay,
        wd_incr_steps=cfg.scheduler_decay_iters, wd_incr_style="constant",
        # on resume the flags win over the checkpoint's values; only the step count is restored
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=True)
    config.no_sync_func = ddp.no_sync
    if params_dtype == torch.float16:  # the loss scale; bf16 and fp32 need none
        config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    # micro-batches differ in rows and length (dynamic batching, last partial batch): pipeline
    # stages then exchange shapes before activations.
    config.variable_seq_lengths = pipeline_parallel
    return OptimizerBundle(ddp=ddp, optimizer=optimizer, scheduler=scheduler)


def grads_are_finite(ddp: DistributedDataParallel) -> bool:
    """Local check of every gradient buffer (after finalize_model_grads reduced them)."""
    return all(bool(torch.isfinite(buffer.grad_data).all()) for buffer in ddp.buffers + ddp.expert_parallel_buffers)


def current_lr(optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])
