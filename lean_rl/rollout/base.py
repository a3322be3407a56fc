"""What every rollout function shares: its result type, the router client, the tokenizer, and the user
extension points resolved (and checked) once at start-up."""

from __future__ import annotations

import functools
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.rollout import rewards
from lean_rl.sample import Sample
from lean_rl.utils.plugins import load_function

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config


@dataclass
class RolloutOutput:
    """What a rollout function returns. Training data does not travel here: finished groups go into the
    buffer. `metrics` are flat floats for logging; `samples` holds evaluation samples (evaluation=True)."""

    metrics: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list] = field(default_factory=dict)


# ---------------------------------------------------------------- the user hooks (docs/extending.md)
# Arguments are positional (`/`): a hook may name its parameters as it likes. `cfg` is the run's frozen
# Config (lean_rl/config.py).
class RolloutFunction(Protocol):
    """--rollout-function-path: `def` or `async def`; finished groups go into `buffer` (None when
    evaluation=True)."""

    def __call__(self, cfg: Config, rollout_id: int, buffer: DataBuffer | None, evaluation: bool = False, /
                 ) -> RolloutOutput | Awaitable[RolloutOutput]: ...


class GenerateFunction(Protocol):
    """--custom-generate-function-path: `async def`, one sample in, the sample (or several) out."""

    def __call__(self, cfg: Config, sample: Sample, sampling_params: dict, /) -> Awaitable[Sample | list[Sample]]: ...


class RewardFunction(Protocol):
    """--custom-rm-path and the --rm-type built-ins: `async def`, one sample's reward."""

    def __call__(self, cfg: Config, sample: Sample, /) -> Awaitable[float]: ...


class GroupRewardFunction(Protocol):
    """--custom-rm-path with --group-rm: `async def`, one reward per sample of the group, in order."""

    def __call__(self, cfg: Config, samples: list[Sample], /) -> Awaitable[list[float]]: ...


class DynamicFilter(Protocol):
    """--dynamic-sampling-filter-path: plain `def`, True keeps the scored group."""

    def __call__(self, cfg: Config, group: list[Sample], /) -> bool: ...


@dataclass(frozen=True)
class Extensions:
    rollout: RolloutFunction
    generate: GenerateFunction | None  # None: the default per-sample generate
    reward: RewardFunction | GroupRewardFunction | None  # None: no reward (e.g. --debug-rollout-only with no rm)
    group_reward: bool  # True: `reward` is a GroupRewardFunction
    dynamic_filter: DynamicFilter | None


def load_extensions(cfg: Config) -> Extensions:
    """Import and check every dotted-path extension; called at start-up, before any engine starts."""
    r = cfg.rollout
    rollout_fn = load_function(r.rollout_function_path, "--rollout-function-path", num_args=4, must_be_sync=False)
    generate_fn = None
    if r.custom_generate_function_path:
        generate_fn = load_function(r.custom_generate_function_path, "--custom-generate-function-path",
                                    num_args=3, must_be_async=True)
    if cfg.reward.custom_rm_path:
        reward_fn = load_function(cfg.reward.custom_rm_path, "--custom-rm-path", num_args=2, must_be_async=True)
    elif cfg.reward.rm_type:
        reward_fn = rewards.BUILTIN_REWARDS[cfg.reward.rm_type]
    else:
        reward_fn = None
    dynamic_filter = None
    if r.dynamic_sampling_filter_path:
        dynamic_filter = load_function(r.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path",
                                       num_args=2, must_be_sync=True)
    return Extensions(rollout_fn, generate_fn, reward_fn, cfg.reward.group_rm, dynamic_filter)


@functools.lru_cache(maxsize=64)
def engine_client(url: str, timeout_s: float, api_key: str | None) -> EngineClient:
    """One client (one connection pool) per server URL and process; `api_key`: the run's
    (cfg.engines.api_key), which every server and the router require."""
    return EngineClient(url, timeout_s=timeout_s, api_key=api_key)


def router_client(cfg: Config) -> EngineClient:
    return engine_client(cfg.engines.router_url, cfg.engines.request_timeout_s, cfg.engines.api_key)


def engine_clients(cfg: Config) -> list[EngineClient]:
    """One client per engine (abort, pause / continue and weight updates are not routed)."""
    return [engine_client(url, cfg.engines.request_timeout_s, cfg.engines.api_key) for url in cfg.engines.engine_urls]


def parse_weight_version(version: str | None) -> int:
    """Engines report weight versions as strings; lean_rl sets them to the train step. SGLang's initial
    'default' is the weights it loaded from disk: version 0."""
    if version is None or not str(version).lstrip("-").isdigit():
        return 0
    return int(version)
