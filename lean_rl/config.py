"""The one typed configuration of a run, built once from the command line.

    cfg = parse_config(sys.argv[1:])
    cfg.engines.router_url, cfg.rollout.n_samples_per_prompt, cfg.train.optimizer.lr, ...

Each part owns its flag group and dataclass (engines: backends/sglang/config.py; rollout, data,
reward, eval: rollout/config.py; model + parallelism: backends/megatron/config.py; optimizer,
batches, checkpoints, placement: backends/megatron/train_config.py; algorithm: algorithms/config.py;
weight sync: weight_sync/config.py; the run: run_config.py). This module assembles them and checks
what only the whole can check (flags that contradict each other). `--sglang-<flag>` and
`--router-<flag>` pass through to the servers; any other unknown flag is an error naming it.
The model architecture comes from the --hf-checkpoint's config.json; Megatron model flags, when
given (e.g. from scripts/models/*.sh), must agree with it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from lean_rl.algorithms.config import AlgorithmConfig, add_algorithm_args, algorithm_config_from_args
from lean_rl.backends.megatron.config import (MegatronConfig, ParallelConfig, add_megatron_args,
                                              parallel_config_from_args)
from lean_rl.backends.megatron.train_config import TrainConfig, add_train_args, train_config_from_args
from lean_rl.backends.sglang.config import EngineConfig, add_engine_args, engine_config_from_args, split_passthrough
from lean_rl.rollout.config import (DataConfig, EvalConfig, RewardConfig, RolloutConfig, add_rollout_args,
                                    rollout_configs_from_args)
from lean_rl.run_config import RunConfig, add_run_args, run_config_from_args
from lean_rl.weight_sync.config import WeightSyncConfig, add_weight_sync_args, weight_sync_config_from_args


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    run: RunConfig
    engines: EngineConfig
    data: DataConfig
    rollout: RolloutConfig
    reward: RewardConfig
    eval: EvalConfig
    megatron: MegatronConfig
    train: TrainConfig
    algorithm: AlgorithmConfig
    weight_sync: WeightSyncConfig
    trainer_device: str  # "cpu" | "cuda", chosen at start-up
    trainer_world_size: int

    @property
    def data_parallel_size(self) -> int:
        return self.megatron.parallel.data_parallel_size(self.trainer_world_size)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an abbreviation would swallow a passthrough flag (--sglang-... / --router-...)
    parser = argparse.ArgumentParser(prog="lean_rl", allow_abbrev=False)
    add_run_args(parser)
    add_engine_args(parser)  # before add_train_args: --hf-checkpoint is one flag for both
    add_rollout_args(parser)
    add_megatron_args(parser)
    add_train_args(parser)
    add_algorithm_args(parser)
    add_weight_sync_args(parser)
    return parser


def _megatron_config(argv: list[str], args: argparse.Namespace, parallel: ParallelConfig) -> MegatronConfig:
    """Architecture from the HF config; Megatron model flags the user typed must agree with it."""
    from lean_rl.backends.megatron.arch_flags import check_given_flags, given_model_flags_parser
    from lean_rl.backends.megatron.hf_config import arch_from_hf_config

    if not args.hf_checkpoint:
        raise ConfigError("--hf-checkpoint is required (the model the engines serve and the trainer starts from)")
    hf_arch = arch_from_hf_config(args.hf_checkpoint, args.make_vocab_size_divisible_by, args.seq_length)
    given, _ = given_model_flags_parser().parse_known_args(argv)
    given = {k: v for k, v in vars(given).items() if k not in ParallelConfig.__dataclass_fields__}
    arch = check_given_flags(given, hf_arch, args.hf_checkpoint) if given else hf_arch
    return MegatronConfig(arch=arch, parallel=parallel)


def parse_config(argv: list[str]) -> Config:
    import torch

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    passthrough = split_passthrough(unknown)
    if passthrough.rest:
        raise ConfigError(f"unrecognized arguments: {' '.join(passthrough.rest)}")
    run = run_config_from_args(args)
    data, rollout, reward, evaluation = rollout_configs_from_args(args)
    if not data.prompt_data and not run.debug_train_only:
        raise ConfigError("--prompt-data is required")
    megatron = _megatron_config(argv, args, parallel_config_from_args(args))
    train = train_config_from_args(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    world_size = train.placement.world_size(device)
    data_parallel = megatron.parallel.data_parallel_size(world_size)  # raises naming the flags
    train.batch.check_data_parallel(data_parallel)
    train.batch.steps_for(rollout.rollout_batch_size * rollout.n_samples_per_prompt, data_parallel)
    if run.async_mode == "full" and rollout.rollout_function_path != "lean_rl.rollout.default.generate_rollout":
        raise ConfigError("--async-mode full generates with the built-in continuous generator; "
                          "--rollout-function-path is not used there (use --custom-generate-function-path)")
    return Config(
        run=run,
        engines=engine_config_from_args(args, passthrough),
        data=data,
        rollout=rollout,
        reward=reward,
        eval=evaluation,
        megatron=megatron,
        train=train,
        algorithm=algorithm_config_from_args(args),
        weight_sync=weight_sync_config_from_args(args, colocate=run.colocate),
        trainer_device=device,
        trainer_world_size=world_size,
    )
