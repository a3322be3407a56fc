"""Shared pieces of the Megatron training tests: configs with small, fast settings (sample groups come
from lean_rl.testing.sample_groups)."""

from __future__ import annotations

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.train_config import BatchConfig, CheckpointConfig, OptimizerConfig, TrainConfig
from lean_rl.testing.sample_groups import make_groups, set_rollout_log_probs  # noqa: F401 (re-exported)
from lean_rl.options import build


def train_config(hf_checkpoint=None, *, lr: float = 1e-3, micro_batch_size: int = 2, load=None,
                 distributed_optimizer: bool = False, max_skipped: int = 5, optimizer: dict | None = None,
                 logits_chunk_size: int = TrainConfig.logits_chunk_size, **batch) -> TrainConfig:
    return TrainConfig(
        optimizer=OptimizerConfig(lr=lr, use_distributed_optimizer=distributed_optimizer, **(optimizer or {})),
        batch=BatchConfig(micro_batch_size=micro_batch_size, **batch),
        checkpoint=CheckpointConfig(hf_checkpoint=None if hf_checkpoint is None else str(hf_checkpoint),
                                    load=None if load is None else str(load)),
        max_consecutive_skipped_steps=max_skipped, logits_chunk_size=logits_chunk_size)


def fixed_old_policy(**kwargs) -> AlgorithmConfig:
    """Old policy = the rollout log-probs (fixed), so training on one batch again and again moves the
    PPO ratio and the surrogate loss falls until the clip stops it."""
    return build(AlgorithmConfig, use_rollout_logprobs=True, **kwargs)
