"""What every rollout function shares: its result type, the checks of what user hooks return, the
run's installed hooks (loaded by lean_rl/extensions.py), engine clients and retries, and the
surplus-work signal."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.client_errors import (EngineConnectionError, EngineError, EngineHTTPError,
                                                   EngineTimeoutError)
# RolloutOutput: what a rollout function returns, imported from here by users (slime's contract included)
from lean_rl.hook_protocols import Extensions, RolloutOutput
from lean_rl.sample import Sample
from lean_rl.utils.plugins import hook_return_error
from lean_rl.utils.threads import run_in_daemon_thread

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config


# ---------------------------------------------------------------- the run's user hooks
# Loaded and checked once at start-up (lean_rl/extensions.py: load_extensions) and installed here by
# the run, so that a rollout function of slime's signature (cfg, rollout_id, buffer, evaluation)
# finds them without reloading them each step. Keyed by the run's Config, which is never replaced.
_INSTALLED: dict[int, tuple[Config, Extensions]] = {}


def install_extensions(cfg: Config, extensions: Extensions) -> Extensions:
    """Make `extensions` what installed_extensions(cfg) returns (Runtime, at start-up)."""
    _INSTALLED[id(cfg)] = (cfg, extensions)  # the Config is held too: its id is not reused meanwhile
    return extensions


# What a run closes when its loop ends, registered by rollout code that started it (the capture
# endpoint's servers): Runtime.on_close, installed here per run like the extensions.
_ON_CLOSE: dict[int, tuple[Config, Callable[[Callable[[], Awaitable[None]]], None]]] = {}


def install_on_close(cfg: Config, register: Callable[[Callable[[], Awaitable[None]]], None]) -> None:
    _ON_CLOSE[id(cfg)] = (cfg, register)


def close_with_the_run(cfg: Config, close: Callable[[], Awaitable[None]]) -> None:
    """Have the run of `cfg` await `close()` when its loop ends (nothing outside a run: the caller closes)."""
    entry = _ON_CLOSE.get(id(cfg))
    if entry is not None and entry[0] is cfg:
        entry[1](close)


def installed_extensions(cfg: Config) -> Extensions:
    """The user hooks of the run whose Config is `cfg`."""
    entry = _INSTALLED.get(id(cfg))
    if entry is None or entry[0] is not cfg:
        raise RuntimeError("no user hooks installed for this Config: a run installs them at start-up; outside a "
                           "run call lean_rl.extensions.install(cfg) before the rollout")
    return entry[1]


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


async def call_rollout_function(cfg: Config, fn, step: int, buffer, evaluation: bool) -> RolloutOutput:
    """The (possibly user-supplied) rollout function `fn`, within --rollout-timeout. A synchronous one
    runs on a daemon thread: one that hangs past the deadline cannot keep the process from exiting."""
    timeout_s = cfg.rollout.timeout_s
    call = fn(cfg, step, buffer, evaluation) if inspect.iscoroutinefunction(fn) else \
        run_in_daemon_thread(fn, cfg, step, buffer, evaluation)
    try:
        out = await asyncio.wait_for(call, timeout_s)
    except asyncio.TimeoutError:
        what = "evaluation" if evaluation else "rollout"
        raise TimeoutError(f"{what} {step} ({rollout_function_path(cfg, evaluation)}) did not finish within "
                           f"--rollout-timeout {timeout_s:g} s; nothing of it was trained (raise "
                           "--rollout-timeout if rollouts are this long)") from None
    return rollout_output(cfg, fn, out, evaluation)  # a wrong return type names the flag and the function


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
def engine_client(url: str, timeout_s: float, api_key: str | None, adapter: str | None = None) -> EngineClient:
    """One client (one connection pool) per server URL and process; `api_key`: the run's
    (cfg.engines.api_key), which every server and the router require; `adapter`: the LoRA adapter
    its requests name (cfg.engines.adapter_name: the policy is the engines' base plus it)."""
    return EngineClient(url, timeout_s=timeout_s, api_key=api_key, adapter=adapter)


def policy_client(cfg: Config, url: str) -> EngineClient:
    """The client of one of the policy's servers (or its router): its requests are served by the policy."""
    return engine_client(url, cfg.engines.request_timeout_s, cfg.engines.api_key, cfg.engines.adapter_name)


def router_client(cfg: Config) -> EngineClient:
    return policy_client(cfg, cfg.engines.router_url)


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
    return await healthy_workers(router_client(cfg))


async def healthy_workers(router: EngineClient) -> tuple[str, ...]:
    """The healthy workers of the router `router` talks to (any engine group's: the policy's, the reward
    model's), sorted, asked at most every 2 s; () when the router cannot say."""
    url = router.base_url
    fetched_at, workers = _router_workers.get(url, (-1e9, ()))
    if time.monotonic() - fetched_at > _ROUTER_WORKERS_TTL_S:
        try:
            body = (await router.request("GET", "/workers", timeout_s=5.0)).json()
            workers = tuple(sorted(w["url"] for w in body["workers"] if w.get("is_healthy")))
        except (EngineError, ValueError, KeyError, TypeError):
            workers = ()
        _router_workers[url] = (time.monotonic(), workers)
    return workers


def engine_clients(cfg: Config) -> list[EngineClient]:
    """One client per engine (abort, pause / continue and weight updates are not routed)."""
    return [policy_client(cfg, url) for url in cfg.engines.engine_urls]


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
