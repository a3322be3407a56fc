"""What the user's hooks are (docs/extending.md): one Protocol per extension point, the Extensions a
run loaded them into (lean_rl/extensions.py load_extensions, installed by rollout/base.install_extensions),
and RolloutOutput, what a rollout function returns. A leaf: the rollout, the slime wrappers and the
train hooks import these types, and this module imports none of them."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from lean_rl.sample import Sample
from lean_rl.utils.plugins import accepts_positional, keyword_only

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config


@dataclass
class RolloutOutput:
    """What a rollout function returns. Training data does not travel here: finished groups go into the
    buffer. `metrics` are flat floats for logging; `samples` holds evaluation samples (evaluation=True)."""

    metrics: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list] = field(default_factory=dict)


# ---------------------------------------------------------------- the hooks
# Arguments are positional (`/`): a hook may name its parameters as it likes. `cfg` is the run's frozen
# Config (lean_rl/config.py).
class RolloutFunction(Protocol):
    """--rollout-function-path: `def` or `async def`; finished groups go into `buffer` (None when
    evaluation=True)."""

    def __call__(self, cfg: Config, rollout_id: int, buffer: DataBuffer | None, evaluation: bool = False, /
                 ) -> RolloutOutput | Awaitable[RolloutOutput]: ...


class GenerateFunction(Protocol):
    """--custom-generate-function-path: `async def`, one sample in, the sample (or several: all of one
    group) out. `evaluation` (True in evaluation) may be left out of the signature: a function of three
    parameters is called with three."""

    def __call__(self, cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False, /
                 ) -> Awaitable[Sample | list[Sample]]: ...


class RewardFunction(Protocol):
    """--custom-rm-path and the --rm-type built-ins: `async def`, one sample's reward (a dict of
    rewards: --reward-key names the trained entry)."""

    def __call__(self, cfg: Config, sample: Sample, /) -> Awaitable[float | dict[str, float]]: ...


class GroupRewardFunction(Protocol):
    """--custom-rm-path with --group-rm: `async def`, one reward per sample of the group, in order."""

    def __call__(self, cfg: Config, samples: list[Sample], /) -> Awaitable[list[float | dict[str, float]]]: ...


class DynamicFilter(Protocol):
    """--dynamic-sampling-filter-path: plain `def`, True keeps the scored group."""

    def __call__(self, cfg: Config, group: list[Sample], /) -> bool: ...


class SampleFilter(Protocol):
    """--rollout-sample-filter-path: plain `def`, one verdict per sample of a group about to be trained
    on (True: train on it); rejected samples stay in their group's statistics (lean_rl/train_hooks.py)."""

    def __call__(self, cfg: Config, group: list[Sample], /) -> list[bool]: ...


class AllSamplesProcess(Protocol):
    """--rollout-all-samples-process-path: `def` or `async def`, called by the default rollout with every
    group it finished, kept or filtered out; its return value is ignored."""

    def __call__(self, cfg: Config, groups: list[list[Sample]], rollout_id: int, /) -> None | Awaitable[None]: ...


class RewardPostProcess(Protocol):
    """--custom-reward-post-process-path: plain `def`, a group's raw rewards -> the rewards the advantage
    estimator gets, one per sample (lean_rl/train_hooks.py)."""

    def __call__(self, cfg: Config, group: list[Sample], /) -> list[float]: ...


@dataclass(frozen=True)
class Extensions:
    rollout: RolloutFunction
    generate: GenerateFunction | None  # None: the default per-sample generate
    reward: RewardFunction | GroupRewardFunction | None  # None: no reward (e.g. --debug-rollout-only with no rm)
    group_reward: bool  # True: `reward` is a GroupRewardFunction
    dynamic_filter: DynamicFilter | None
    eval_rollout: RolloutFunction | None = None  # --eval-function-path; None: `rollout`
    sample_filter: SampleFilter | None = None
    all_samples_process: AllSamplesProcess | None = None
    reward_post_process: RewardPostProcess | None = None
    # checked at start-up only; the buffer (data source), the driver (advantages) and the ranks (loss)
    # load them again from the flags (buffer/user_source.py, algorithms/hooks.py)
    data_source: Callable | None = None
    custom_advantage: Callable | None = None
    custom_loss: Callable | None = None
    custom_tis: Callable | None = None
    # --eval-config sets with a reward of their own: name -> (reward function, whether it scores groups)
    eval_rewards: dict[str, tuple[Callable, bool]] = field(default_factory=dict)
    @functools.cached_property
    def generate_call(self) -> Callable[..., Awaitable] | None:
        """`generate` as the rollout calls it: (cfg, sample, sampling_params, evaluation), whatever of
        these the user's signature takes (inspected once, on first use)."""
        return None if self.generate is None else generate_caller(self.generate)

    @property
    def evaluation_rollout(self) -> RolloutFunction:
        return self.eval_rollout or self.rollout


def generate_caller(fn: Callable) -> Callable[..., Awaitable]:
    """`fn` as a call of (cfg, sample, sampling_params, evaluation): passes `evaluation` as the fourth
    positional argument or the keyword-only `evaluation` (slime's way) when the signature has one,
    else calls it with three."""
    if accepts_positional(fn, 4):
        return fn
    if keyword_only(fn, "evaluation"):
        return lambda cfg, sample, params, evaluation=False: fn(cfg, sample, params, evaluation=evaluation)
    return lambda cfg, sample, params, evaluation=False: fn(cfg, sample, params)
