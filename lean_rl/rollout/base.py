"""What every rollout function shares: its result type, the router client, the tokenizer, and the user
extension points resolved (and checked) once at start-up."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from lean_rl.backends.sglang.client import (EngineClient, EngineConnectionError, EngineError, EngineHTTPError,
                                            EngineTimeoutError)
from lean_rl.rollout import rewards
from lean_rl.rollout.config import MULTI_TURN_GENERATE
from lean_rl.sample import Sample
from lean_rl.utils.plugins import accepts_positional, hook_return_error, keyword_only, load_function

logger = logging.getLogger(__name__)

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
    # `generate` as the rollout calls it: (cfg, sample, sampling_params, evaluation), whatever of these
    # the user's signature takes (inspected once, here)
    generate_call: Callable[..., Awaitable] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "generate_call", None if self.generate is None else generate_caller(self.generate))

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


def load_extensions(cfg: Config) -> Extensions:
    """Import and check every dotted-path extension; called at start-up, before any engine starts."""
    from lean_rl.algorithms.hooks import load_advantage_function, load_loss_function
    from lean_rl.buffer.user_source import load_source_factory

    r = cfg.rollout
    rollout_fn = load_function(r.rollout_function_path, "--rollout-function-path", num_args=4, must_be_sync=False)
    eval_fn = None
    if cfg.eval.function_path:
        eval_fn = load_function(cfg.eval.function_path, "--eval-function-path", num_args=4, must_be_sync=False)
    generate_fn = None
    if r.custom_generate_function_path:
        generate_fn = load_function(r.custom_generate_function_path, "--custom-generate-function-path",
                                    num_args=(3, 4), must_be_async=True)
    if r.multi_turn.environment_path or r.custom_generate_function_path == MULTI_TURN_GENERATE:
        from lean_rl.rollout.multi_turn import check_environment  # multi_turn builds on this module

        check_environment(cfg)
    if cfg.reward.custom_rm_path:
        reward_fn = load_function(cfg.reward.custom_rm_path, "--custom-rm-path", num_args=2, must_be_async=True)
    elif cfg.reward.rm_type:
        reward_fn = rewards.BUILTIN_REWARDS[cfg.reward.rm_type]
    else:
        reward_fn = None

    def optional(path: str | None, flag: str, num_args: int, **checks) -> Callable | None:
        return load_function(path, flag, num_args=num_args, **checks) if path else None

    return Extensions(
        rollout_fn, generate_fn, reward_fn, cfg.reward.group_rm,
        dynamic_filter=optional(r.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path", 2, must_be_sync=True),
        eval_rollout=eval_fn,
        sample_filter=optional(r.rollout_sample_filter_path, "--rollout-sample-filter-path", 2, must_be_sync=True),
        all_samples_process=optional(r.rollout_all_samples_process_path, "--rollout-all-samples-process-path", 3),
        reward_post_process=optional(cfg.reward.custom_reward_post_process_path, "--custom-reward-post-process-path",
                                     2, must_be_sync=True),
        data_source=load_source_factory(cfg.data.data_source_path) if cfg.data.data_source_path else None,
        custom_advantage=load_advantage_function(cfg.algorithm.custom_advantage_function_path)
        if cfg.algorithm.custom_advantage_function_path else None,
        custom_loss=load_loss_function(cfg.algorithm.custom_loss_function_path)
        if cfg.algorithm.custom_loss_function_path else None,
    )


# ---------------------------------------------------------------- what the hooks return
# A hook that raises on one sample is that sample's failure (counted, the run goes on); one that
# returns the wrong type is a bug in it: HookReturnError (utils/plugins.py) stops the run, naming the
# flag, the function and what it returned.
def generated_samples(cfg: Config, generate_fn, result, group_index: int | None = None) -> list[Sample]:
    """What a generate function returned (a Sample or a non-empty list of distinct Samples, all of the
    prompt's group `group_index` when given), as a list."""
    expected = "the Sample, or a non-empty list of Samples"
    flag = cfg.rollout.generate_function_flag
    samples = [result] if isinstance(result, Sample) else result
    if not (isinstance(samples, list) and samples and all(isinstance(s, Sample) for s in samples)):
        raise hook_return_error(flag, generate_fn, result, expected)
    if len({id(s) for s in samples}) != len(samples):
        raise hook_return_error(flag, generate_fn, result, f"{expected}; it holds the same Sample object more than "
                                "once (copy.deepcopy the sample for each one you add)")
    if group_index is not None and any(s.group_index != group_index for s in samples):
        raise hook_return_error(flag, generate_fn, result, f"{expected}, all of the prompt's group: every sample "
                                f"must keep group_index {group_index}, got {[s.group_index for s in samples]}")
    return samples


def filter_verdict(cfg: Config, filter_fn, verdict) -> bool:
    """A dynamic-sampling filter's answer: a bool (numpy's bool_ too)."""
    if isinstance(verdict, bool) or (type(verdict).__module__ == "numpy" and type(verdict).__name__ in ("bool", "bool_")):
        return bool(verdict)
    return _raise(hook_return_error(f"--dynamic-sampling-filter-path {cfg.rollout.dynamic_sampling_filter_path}",
                                    filter_fn, verdict, "True (keep the group) or False (drop it)"))


def rollout_function_path(cfg: Config, evaluation: bool = False) -> str:
    """The dotted path of the function that runs a rollout, or an evaluation."""
    return cfg.eval.function_path if evaluation and cfg.eval.function_path else cfg.rollout.rollout_function_path


def rollout_function_flag(cfg: Config, evaluation: bool = False) -> str:
    """The flag and path of the function that runs a rollout, or an evaluation."""
    flag = "--eval-function-path" if evaluation and cfg.eval.function_path else "--rollout-function-path"
    return f"{flag} {rollout_function_path(cfg, evaluation)}"


def rollout_output(cfg: Config, rollout_fn, output, evaluation: bool = False) -> RolloutOutput:
    """A rollout function's result; a RolloutOutput whose metrics map names to numbers."""
    expected = "a lean_rl.rollout.base.RolloutOutput (metrics: dict[str, float], samples: dict[str, list])"
    flag = rollout_function_flag(cfg, evaluation)
    if not isinstance(output, RolloutOutput) or not isinstance(output.metrics, dict) \
            or not isinstance(output.samples, dict):
        raise hook_return_error(flag, rollout_fn, output, expected)
    bad = {k: v for k, v in output.metrics.items()
           if not isinstance(k, str) or isinstance(v, (str, bytes)) or not hasattr(v, "__float__")}
    if bad:
        raise hook_return_error(flag, rollout_fn, output, f"{expected}; these metrics are not numbers: {bad}")
    return output


def _raise(error: Exception):
    raise error


# ---------------------------------------------------------------- surplus work
# Set (per rollout task) by the group runner to an event that is set while what still runs is surplus
# (the batch is full, or the async generator pauses for a weight update). Aborting the engines stops
# requests in flight; a multi-turn generate between two requests (inside an environment step, an
# agent's own code) asks `rollout_stopping()` before its next request and stops there.
_STOPPING: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("lean_rl_rollout_stopping",
                                                                               default=None)


def set_stopping_event(event: asyncio.Event) -> None:
    """Make `event` the one `rollout_stopping()` reads in this task and the tasks it starts."""
    _STOPPING.set(event)


def rollout_stopping() -> bool:
    """True when the rollout no longer wants more of this sample: return it ABORTED (no new request)."""
    event = _STOPPING.get()
    return event is not None and event.is_set()


def stopping_event() -> asyncio.Event | None:
    """The event behind `rollout_stopping()`, for code that answers requests outside the rollout's
    tasks (the capture endpoint's handlers): take it while in the generate function."""
    return _STOPPING.get()


@functools.lru_cache(maxsize=64)
def engine_client(url: str, timeout_s: float, api_key: str | None) -> EngineClient:
    """One client (one connection pool) per server URL and process; `api_key`: the run's
    (cfg.engines.api_key), which every server and the router require."""
    return EngineClient(url, timeout_s=timeout_s, api_key=api_key)


def router_client(cfg: Config) -> EngineClient:
    return engine_client(cfg.engines.router_url, cfg.engines.request_timeout_s, cfg.engines.api_key)


_T = TypeVar("_T")


async def retry_engine_call(cfg: Config, call: Callable[[int], Awaitable[_T]], on_retry=None) -> _T:
    """`await call(attempt)`, again (--rollout-request-retries times at most, waiting 1, 2, 4 ... 30 s)
    when the engine or router cannot be reached, times out or answers 5xx; a 4xx raises at once.
    `on_retry(err)` is told of each failure that is retried."""
    attempts = cfg.rollout.request_retries + 1
    for attempt in range(attempts):
        try:
            return await call(attempt)
        except (EngineConnectionError, EngineTimeoutError, EngineHTTPError) as err:
            retryable = not isinstance(err, EngineHTTPError) or err.status_code >= 500
            if not retryable or attempt == attempts - 1:
                raise
            if on_retry is not None:
                on_retry(err)
            await asyncio.sleep(min(2.0**attempt, 30.0))
    raise AssertionError("unreachable")


_ROUTER_WORKERS_TTL_S = 2.0
_router_workers: dict[str, tuple[float, tuple[str, ...]]] = {}  # router url -> (monotonic time, engine urls)


async def serving_engine_urls(cfg: Config) -> tuple[str, ...]:
    """The engines the router serves now (its healthy workers: a restarted engine is listed only once
    it has the trainer's weights), sorted, asked at most every 2 s; () when the router cannot say."""
    url = cfg.engines.router_url
    fetched_at, workers = _router_workers.get(url, (-1e9, ()))
    if time.monotonic() - fetched_at > _ROUTER_WORKERS_TTL_S:
        try:
            body = (await router_client(cfg).request("GET", "/workers", timeout_s=5.0)).json()
            workers = tuple(sorted(w["url"] for w in body["workers"] if w.get("is_healthy")))
        except (EngineError, ValueError, KeyError, TypeError):
            workers = ()
        _router_workers[url] = (time.monotonic(), workers)
    return workers


def engine_clients(cfg: Config) -> list[EngineClient]:
    """One client per engine (abort, pause / continue and weight updates are not routed)."""
    return [engine_client(url, cfg.engines.request_timeout_s, cfg.engines.api_key) for url in cfg.engines.engine_urls]


async def on_every_engine(cfg: Config, call: Callable[[EngineClient], Awaitable]) -> None:
    """`call(client)` on every engine at once (abort, pause, continue: the router does not forward
    them). An engine that cannot be reached is dead: nothing runs or waits there, and the monitor
    restarts it fresh (not paused), so it is skipped with a warning; any other failure is raised."""
    clients = engine_clients(cfg)
    results = await asyncio.gather(*(call(client) for client in clients), return_exceptions=True)
    for client, result in zip(clients, results):
        if isinstance(result, EngineConnectionError):
            logger.warning("engine %s unreachable (%s); skipped: the engine monitor restarts it", client.base_url, result)
        elif isinstance(result, BaseException):
            raise result


def parse_weight_version(version: str | None) -> int:
    """Engines report weight versions as strings; lean_rl sets them to the train step. SGLang's initial
    'default' is the weights it loaded from disk: version 0."""
    if version is None or not str(version).lstrip("-").isdigit():
        return 0
    return int(version)
