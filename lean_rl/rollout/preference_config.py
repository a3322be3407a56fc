"""What --loss-type dpo_loss / rm_loss (training on preference pairs, rollout/preference.py) asks of the
other flags, checked once by lean_rl/config.py: the pairs' rollout, two samples per prompt, no label, and
one optimizer step per rollout (the pair losses' per-row coefficients are computed at the step's
weights: algorithms/preference.py)."""

from __future__ import annotations

from dataclasses import replace

from lean_rl.buffer.config import DataConfig
from lean_rl.options import ConfigError, rebuild
from lean_rl.rollout.config import RolloutConfig

PREFERENCE_ROLLOUT = "lean_rl.rollout.preference.generate_rollout"
DEFAULT_ROLLOUT = "lean_rl.rollout.default.generate_rollout"


def preference_data(loss_type: str, data: DataConfig) -> DataConfig:
    """The pairs carry no reference answer: --label-key is not read. Every row of --prompt-data is
    checked now (buffer/preference_pairs.read_pairs), so a row without its responses fails the start-up
    with one line naming the file, the row and the field."""
    from lean_rl.buffer.preference_pairs import read_pairs

    if data.prompt_data is None:
        raise ConfigError(f"--loss-type {loss_type} reads its pairs from --prompt-data (a jsonl or parquet file)")
    try:
        read_pairs(data.prompt_data, data.chosen_key, data.rejected_key)
    except (OSError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return rebuild(data, label_key=None) if data.label_key else data


def preference_rollout(loss_type: str, rollout: RolloutConfig) -> RolloutConfig:
    if rollout.rollout_function_path not in (DEFAULT_ROLLOUT, PREFERENCE_ROLLOUT):
        raise ConfigError(f"--loss-type {loss_type} trains on --prompt-data's pairs ({PREFERENCE_ROLLOUT}); "
                          f"--rollout-function-path {rollout.rollout_function_path} is not used there")
    if rollout.n_samples_per_prompt != 2:
        raise ConfigError(f"--loss-type {loss_type}: each pair is two samples (chosen, rejected): "
                          f"--n-samples-per-prompt 2, got {rollout.n_samples_per_prompt}")
    return replace(rollout, rollout_function_path=PREFERENCE_ROLLOUT)


def check_one_step_per_rollout(loss_type: str, steps: int) -> None:
    if steps != 1:
        raise ConfigError(f"--loss-type {loss_type} takes one optimizer step per rollout of pairs (its coefficients are "
                          f"computed at the step's weights); the flags give {steps}: set --global-batch-size to "
                          "--rollout-batch-size x 2 (or leave it and --num-steps-per-rollout unset)")
