"""The one typed configuration of a run, built once from the command line.

    cfg = parse_config(sys.argv[1:])
    cfg.engines.router_url, cfg.rollout.n_samples_per_prompt, cfg.reward.rm_type, ...

Each backend owns its flag group and dataclass (engines: backends/sglang/config.py; rollout, data,
reward, eval: rollout/config.py); this module only assembles them. `--sglang-<flag>` and
`--router-<flag>` pass through to the servers; any other unknown flag is an error naming it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from lean_rl.backends.sglang.config import EngineConfig, add_engine_args, engine_config_from_args, split_passthrough
from lean_rl.rollout.config import (DataConfig, EvalConfig, RewardConfig, RolloutConfig, add_rollout_args,
                                    rollout_configs_from_args)


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    engines: EngineConfig
    data: DataConfig
    rollout: RolloutConfig
    reward: RewardConfig
    eval: EvalConfig


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an abbreviation would swallow a passthrough flag (--sglang-... / --router-...)
    parser = argparse.ArgumentParser(prog="lean_rl", allow_abbrev=False)
    add_engine_args(parser)
    add_rollout_args(parser)
    return parser


def parse_config(argv: list[str]) -> Config:
    args, unknown = build_parser().parse_known_args(argv)
    passthrough = split_passthrough(unknown)
    if passthrough.rest:
        raise ConfigError(f"unrecognized arguments: {' '.join(passthrough.rest)}")
    data, rollout, reward, evaluation = rollout_configs_from_args(args)
    return Config(engines=engine_config_from_args(args, passthrough), data=data, rollout=rollout,
                  reward=reward, eval=evaluation)
