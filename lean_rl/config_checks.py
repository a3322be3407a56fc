"""What only the whole configuration can check (config.parse_config calls these): flags of two parts
that contradict each other (the async mode against the rollout, the reward's sources), the rollout that
--loss-type sft_loss / dpo_loss / rm_loss implies, and why a weight-sync transport cannot reach the
engines (CUDA IPC across the layout, a LoRA adapter on a family whose HF modules differ)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from lean_rl.algorithms.names import PAIRWISE_LOSS_TYPES
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.trainer_layout import TrainerLayout
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.buffer.config import DataConfig
from lean_rl.options import ConfigError
from lean_rl.rollout.config import RewardConfig, RolloutConfig
from lean_rl.rollout.preference_config import PREFERENCE_ROLLOUT, preference_rollout
from lean_rl.rollout.reward_serving_config import RewardServingConfig
from lean_rl.run_config import RunConfig

DEFAULT_ROLLOUT = "lean_rl.rollout.default.generate_rollout"  # --rollout-function-path's default
SFT_ROLLOUT = "lean_rl.rollout.sft.generate_rollout"  # the rollout of --loss-type sft_loss


def check_run_against_rollout(run: RunConfig, rollout: RolloutConfig) -> None:
    if run.async_mode == "full" and rollout.max_staleness is None:
        raise ConfigError("--async-mode full needs --max-staleness (how many policy versions old a sample may be)")
    if run.async_mode == "one-step" and rollout.max_staleness is not None and rollout.max_staleness < 1:
        raise ConfigError("--async-mode one-step trains on samples one version old: --max-staleness must be >= 1")
    if run.async_mode != "off" and rollout.rollout_function_path in (SFT_ROLLOUT, PREFERENCE_ROLLOUT):
        raise ConfigError(f"--async-mode {run.async_mode}: training on given data (--loss-type sft_loss / dpo_loss / "
                          "rm_loss) generates nothing to overlap; run python -m lean_rl.train")
    if run.async_mode == "full" and rollout.rollout_all_samples_process_path:
        raise ConfigError("--rollout-all-samples-process-path is called at the end of each rollout of the default "
                          "rollout function; --async-mode full generates continuously, with no rollout to end")


def check_reward_choice(reward: RewardConfig, serving: RewardServingConfig) -> None:
    """Which function gives the reward: --reward-routes, else --rm-type / --custom-rm-path, else the one
    served rewarder given (rollout/reward_routing.py: served_reward_function)."""
    given = reward.rm_type or reward.custom_rm_path
    if serving.reward_routes is not None and given:
        raise ConfigError(f"--reward-routes {serving.reward_routes} picks each sample's reward: drop --rm-type / "
                          "--custom-rm-path (a route may name either)")
    if serving.reward_routes is None and not given and serving.rm_hf_checkpoint is not None and serving.has_judge:
        raise ConfigError("--rm-hf-checkpoint and a judge (--judge-hf-checkpoint / --judge-url): say which scores "
                          "which sample with --reward-routes FILE, or combine them in --custom-rm-path")


def sft_rollout(args: argparse.Namespace, data: DataConfig, rollout: RolloutConfig) -> RolloutConfig:
    """--loss-type sft_loss: the conversations of --prompt-data become the samples (rollout/sft.py)."""
    if args.loss_type in PAIRWISE_LOSS_TYPES:
        return preference_rollout(args.loss_type, rollout)
    if args.loss_type != "sft_loss":
        if rollout.rollout_function_path == SFT_ROLLOUT:
            raise ConfigError(f"--rollout-function-path {SFT_ROLLOUT} builds SFT samples: it needs --loss-type sft_loss")
        return rollout
    if rollout.rollout_function_path not in (DEFAULT_ROLLOUT, SFT_ROLLOUT):
        raise ConfigError(f"--loss-type sft_loss trains on --prompt-data's conversations ({SFT_ROLLOUT}); "
                          f"--rollout-function-path {rollout.rollout_function_path} is not used there")
    if not data.apply_chat_template:
        raise ConfigError("--loss-type sft_loss renders each conversation with the chat template: pass "
                          "--apply-chat-template")
    if rollout.n_samples_per_prompt != 1:
        raise ConfigError(f"--loss-type sft_loss trains each conversation once: --n-samples-per-prompt 1, got "
                          f"{rollout.n_samples_per_prompt}")
    return replace(rollout, rollout_function_path=SFT_ROLLOUT)


def ipc_unserved(layout: TrainerLayout, parallel: ParallelConfig, engines: EngineConfig,
                 engine_nodes: list[int]) -> str | None:
    """Colocated on GPU: why CUDA IPC (the tensor transport) cannot reach every engine, or None."""
    from lean_rl.weight_sync.ipc_map import IpcLayout, ipc_refusal

    if layout.device != "cuda":
        return None
    assert engines.num_engines is not None  # EngineConfig.derive_fields set it before validation
    ipc = IpcLayout(parallel.tensor_model_parallel_size, layout.data_parallel_size,
                    parallel.pipeline_model_parallel_size, layout.ranks_per_node, engines.num_engines,
                    engines.gpus_per_engine, tuple(engine_nodes))
    return ipc_refusal(ipc)


def lora_unserved_family(hf_checkpoint: str | None, lora: Any) -> str | None:
    """Why this checkpoint's family cannot take the LoRA adapter apart from its base (None: it can)."""
    if not hf_checkpoint or not lora.enabled:
        return None
    from lean_rl.backends.megatron.hf_config import VLM_TEXT_FAMILIES, hf_family
    from lean_rl.backends.megatron.hf_weights.families import lora_hf_modules_differ
    from lean_rl.backends.megatron.lora_config import LORA_HF_MODULES, LORA_TARGETS

    targets = lora.lora_target_modules or LORA_TARGETS
    family = hf_family(hf_checkpoint)
    family = VLM_TEXT_FAMILIES.get(family, family)  # a VLM's adapters are its language model's
    return lora_hf_modules_differ(family, {t: LORA_HF_MODULES[t] for t in targets})
