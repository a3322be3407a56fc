"""BatchPlan: how a rollout becomes optimizer steps and micro-batches, derived once at start-up from the
batch flags (train_config.BatchConfig) and the data-parallel size. Errors name the flags."""

from __future__ import annotations

from dataclasses import dataclass

from lean_rl.backends.megatron.train_config import BatchConfig
from lean_rl.options import ConfigError


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class BatchPlan:
    """How a rollout becomes optimizer steps and micro-batches, derived once at start-up from the
    batch flags and the data-parallel size (config.parse_config for a run, with the rollout's size;
    MegatronGroup.setup_training for a group used on its own). Errors name the flags."""

    batch: BatchConfig
    data_parallel_size: int
    samples_per_rollout: int | None = None  # --rollout-batch-size x --n-samples-per-prompt, when known

    def __post_init__(self) -> None:
        b, unit = self.batch, self.micro_batch_unit
        # Fixed micro-batches: every DP rank runs whole micro-batches of every optimizer step.
        if unit is not None and b.global_batch_size is not None:
            _require(b.global_batch_size % unit == 0,
                     f"--global-batch-size {b.global_batch_size} must be a multiple of --micro-batch-size "
                     f"{b.micro_batch_size} x data-parallel size {self.data_parallel_size} = {unit}")
        if self.samples_per_rollout is not None:
            self.steps_for(self.samples_per_rollout)  # the flags agree on the rollout's size: fail at start-up

    @property
    def steps_per_rollout(self) -> int | None:
        """Optimizer steps of a rollout of the known size (None when the size is not known)."""
        return None if self.samples_per_rollout is None else self.steps_for(self.samples_per_rollout)

    @property
    def micro_batch_unit(self) -> int | None:
        """Samples in one micro-batch on every DP rank (fixed micro-batches); None with dynamic sizes."""
        if self.batch.use_dynamic_batch_size:
            return None
        return self.batch.micro_batch_size * self.data_parallel_size

    def steps_for(self, num_samples: int) -> int:
        """Optimizer steps for a rollout of `num_samples` (a generate that fans out may change the
        count from rollout to rollout); errors name the flags that disagree."""
        b = self.batch
        if b.global_batch_size is not None:
            _require(num_samples % b.global_batch_size == 0,
                     f"the rollout has {num_samples} samples, not a multiple of --global-batch-size "
                     f"{b.global_batch_size}")
            steps = num_samples // b.global_batch_size
            _require(b.num_steps_per_rollout is None or b.num_steps_per_rollout == steps,
                     f"--num-steps-per-rollout {b.num_steps_per_rollout} disagrees with --global-batch-size "
                     f"{b.global_batch_size} for a rollout of {num_samples} samples ({steps} steps)")
        else:
            steps = b.num_steps_per_rollout or 1
            _require(num_samples % steps == 0,
                     f"the rollout has {num_samples} samples, not divisible by --num-steps-per-rollout {steps}")
        per_step, unit = num_samples // steps, self.micro_batch_unit
        if unit is not None:
            _require(per_step % unit == 0,
                     f"{per_step} samples per optimizer step is not a multiple of --micro-batch-size "
                     f"{b.micro_batch_size} x data-parallel size {self.data_parallel_size} = {unit}")
        return steps
