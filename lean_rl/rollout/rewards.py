"""Built-in reward functions (`--rm-type`) and the wrapper that keeps a failing reward from stopping a run.

Every reward function has the signature `async def reward(cfg: Config, sample: Sample) -> float`; a group
reward (`--group-rm`) is `async def reward(cfg: Config, samples: list[Sample]) -> list[float]` (the
RewardFunction / GroupRewardFunction protocols in rollout/base.py; docs/extending.md). A user reward may
return a dict of floats instead of a float: --reward-key names the entry that is trained on.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import concurrent.futures.process
import math
import multiprocessing
import re
import types
from typing import TYPE_CHECKING

import httpx

from lean_rl.sample import Sample, Status
from lean_rl.utils.plugins import HookReturnError, hook_return_error

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config
    from lean_rl.hook_protocols import GroupRewardFunction, RewardFunction


# ---------------------------------------------------------------- text helpers
def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in `text`, braces balanced; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower().rstrip("."))


def exact_match(response: str, label: str) -> float:
    return float(_normalize(response) == _normalize(str(label)))


def boxed_match(response: str, label: str) -> float:
    answer = last_boxed(response)
    return float(answer is not None and _normalize(answer) == _normalize(str(label)))


def token_f1(response: str, label: str) -> float:
    """SQuAD-style bag-of-words F1 between the response and the label."""
    pred, gold = _normalize(response).split(), _normalize(str(label)).split()
    common = collections.Counter(pred) & collections.Counter(gold)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------- math-verify, in a worker process
def _math_verify_in_worker(response: str, label: str, timeout_s: int) -> float:
    # math-verify bounds its own parsing with signal.alarm, which only works on a main thread: the
    # worker process's main thread is one, the rollout's event loop thread may not be.
    from math_verify import parse, verify

    gold = parse(label if "$" in label or "\\" in label else f"${label}$", parsing_timeout=timeout_s)
    answer = parse(response, parsing_timeout=timeout_s)
    return float(bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=timeout_s))


_MATH_POOL: concurrent.futures.ProcessPoolExecutor | None = None


def _math_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _MATH_POOL
    if _MATH_POOL is None:
        # spawn, not fork: the driver holds threads (Ray, httpx) that a fork would copy mid-state.
        _MATH_POOL = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_MATH_POOL.shutdown, wait=False, cancel_futures=True)
    return _MATH_POOL


def _replace_math_pool(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """A worker stuck past its deadline would hold every later reward behind it: kill it, and let the
    next reward start a new pool. Calls queued on the old pool fail (BrokenProcessPool / cancelled)
    and math_reward submits them again."""
    global _MATH_POOL
    if _MATH_POOL is pool:
        _MATH_POOL = None
    # ProcessPoolExecutor has no public way to kill a busy worker (shutdown waits for it or leaves it)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


async def math_reward(cfg: Config, sample: Sample) -> float:
    timeout_s = cfg.reward.rm_timeout
    deadline_s = timeout_s * 3 + 5
    for _ in range(3):
        pool = _math_pool()
        future = pool.submit(_math_verify_in_worker, sample.response, str(sample.label), max(1, int(timeout_s)))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout=deadline_s)
        except asyncio.TimeoutError:
            _replace_math_pool(pool)
            raise TimeoutError(f"math-verify gave no answer within {deadline_s:g} s (3 x --rm-timeout + 5); "
                               "its worker was replaced") from None
        except (asyncio.CancelledError, concurrent.futures.process.BrokenProcessPool):
            if not (future.cancelled() or isinstance(future.exception(), concurrent.futures.process.BrokenProcessPool)):
                raise  # this task itself was cancelled
            # the pool was replaced under this call (another reward's worker was stuck): submit again
    raise RuntimeError("math-verify: its worker pool broke three times in a row")


async def exact_reward(cfg: Config, sample: Sample) -> float:
    return exact_match(sample.response, sample.label)


async def boxed_reward(cfg: Config, sample: Sample) -> float:
    return boxed_match(sample.response, sample.label)


async def f1_reward(cfg: Config, sample: Sample) -> float:
    return token_f1(sample.response, sample.label)


# ---------------------------------------------------------------- remote reward model
async def remote_reward(cfg: Config, sample: Sample) -> float:
    """POST {prompt, response, label, metadata} to --rm-url; the server answers a number or {"reward": x}."""
    body = {"prompt": sample.prompt, "response": sample.response, "label": sample.label, "metadata": sample.metadata}
    last_error: Exception | None = None
    async with httpx.AsyncClient(timeout=cfg.reward.rm_timeout) as client:
        for attempt in range(cfg.reward.rm_retries + 1):
            try:
                reply = await client.post(cfg.reward.rm_url, json=body)
                reply.raise_for_status()
                data = reply.json()
                return float(data["reward"] if isinstance(data, dict) else data)
            except (httpx.TransportError, httpx.HTTPStatusError) as err:
                last_error = err
                await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
    raise RuntimeError(f"--rm-url {cfg.reward.rm_url}: no answer after {cfg.reward.rm_retries + 1} tries: {last_error}")


BUILTIN_REWARDS: dict[str, RewardFunction] = {
    "math": math_reward,
    "boxed": boxed_reward,
    "exact": exact_reward,
    "f1": f1_reward,
    "remote": remote_reward,
}


# ---------------------------------------------------------------- applying rewards safely
def reward_key(cfg: Config, evaluation: bool = False) -> str | None:
    """The entry of a reward dict that is trained on (--reward-key) or evaluated (--eval-reward-key,
    default --reward-key)."""
    if evaluation and cfg.eval.reward_key:
        return cfg.eval.reward_key
    return cfg.reward.reward_key


async def score_group(cfg: Config, samples: list[Sample], reward_fn: RewardFunction | GroupRewardFunction | None,
                      group_rm: bool, counters: collections.Counter, evaluation: bool = False) -> None:
    """Set `reward` on every sample. A reward the generate function already set (sample.reward not None)
    is kept and not scored again; a dict there, as from a reward function, is reduced to its
    --reward-key entry (--eval-reward-key in evaluation) and kept whole in metadata["rewards"].
    `reward_fn` None: only those. A reward that raises or times out, or returns NaN / inf, marks the
    sample FAILED with reward 0 and counts it; the run goes on. A reward that returns something that
    is not a number or a dict of numbers (a group reward: not a list of them) is a bug:
    HookReturnError stops the run."""
    key = reward_key(cfg, evaluation)
    preset = {id(s) for s in samples if s.reward is not None}
    for sample in samples:
        if id(sample) not in preset:
            continue
        if sample.status == Status.FAILED:
            sample.reward = 0.0
        else:
            _set_reward(sample, *_reward_value(cfg, None, sample.reward, key, sample.reward), counters)
    if reward_fn is None:
        for sample in samples:
            if sample.status == Status.FAILED:
                sample.reward = 0.0
        return
    timeout_s = cfg.reward.rm_timeout * 3 + 5
    if group_rm:
        if len(preset) == len(samples):
            return  # every reward came with its sample: nothing to score
        try:
            rewards = await asyncio.wait_for(reward_fn(cfg, samples), timeout=timeout_s)
        except Exception as err:  # noqa: BLE001 - user code: any failure is counted, not fatal
            for sample in samples:
                if id(sample) not in preset:
                    _mark_failed(sample, err, counters)
            return
        if not isinstance(rewards, (list, tuple)):
            raise hook_return_error(_reward_flag(cfg), reward_fn, rewards, _expected(key, group=True))
        values = [_reward_value(cfg, reward_fn, value, key, rewards, group=True) for value in rewards]
        if len(values) != len(samples):
            err = ValueError(f"group reward returned {len(values)} values for {len(samples)} samples")
            for sample in samples:
                if id(sample) not in preset:
                    _mark_failed(sample, err, counters)
            return
        for sample, (value, entries) in zip(samples, values):
            if id(sample) not in preset:
                _set_reward(sample, value, entries, counters)
        return

    async def one(sample: Sample) -> None:
        if sample.status == Status.FAILED:
            sample.reward = 0.0
            return
        if id(sample) in preset:
            return
        try:
            value = await asyncio.wait_for(reward_fn(cfg, sample), timeout=timeout_s)
        except Exception as err:  # noqa: BLE001
            _mark_failed(sample, err, counters)
            return
        _set_reward(sample, *_reward_value(cfg, reward_fn, value, key, value), counters)

    await asyncio.gather(*(one(s) for s in samples))


def _reward_flag(cfg: Config) -> str:
    if cfg.reward.custom_rm_path:
        return f"--custom-rm-path {cfg.reward.custom_rm_path}"
    return f"--rm-type {cfg.reward.rm_type}"


def _preset_flag(cfg: Config) -> str:
    rollout = getattr(cfg, "rollout", None)
    return f"{rollout.generate_function_flag if rollout is not None else 'the generate function'} (sample.reward)"


def _expected(key: str | None, group: bool = False) -> str:
    one = "a number (int or float)" + (f", or a dict of numbers holding --reward-key {key!r}" if key
                                       else ", or a dict of numbers with --reward-key naming the trained one")
    return f"a list with one of these per sample: {one}" if group else one


def _reward_value(cfg: Config, reward_fn, value, key: str | None, returned,
                  group: bool = False) -> tuple[float, dict[str, float] | None]:
    """(the trained reward, the whole dict or None) from what a reward returned: a number (bool, int,
    float, numpy / torch scalars) or a dict of them holding `key`; HookReturnError otherwise.
    `reward_fn` None: a reward the generate function set."""
    expected = _expected(key, group)

    def error(detail: str = "") -> HookReturnError:
        if reward_fn is None:
            return hook_return_error(_preset_flag(cfg), _generate_fn_stand_in(cfg), returned, expected + detail)
        return hook_return_error(_reward_flag(cfg), reward_fn, returned, expected + detail)

    if isinstance(value, dict):
        entries = {}
        for name, entry in value.items():
            if not isinstance(name, str):
                raise error("; its keys must be strings")
            entries[name] = _number(entry, lambda: error(f"; entry {name!r} is not a number"))
        if key is None:
            raise error(": it returned a dict, so pass --reward-key to choose the entry that is trained on")
        if key not in entries:
            raise error(f": the dict has no entry {key!r} (--reward-key / --eval-reward-key); its keys are "
                        f"{sorted(entries)}")
        return entries[key], entries
    return _number(value, error), None


def _number(value, error) -> float:
    """float(value) for a number; `error()` (a HookReturnError) raised otherwise."""
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise error()
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a tensor of several elements
        raise error() from None


def _generate_fn_stand_in(cfg: Config):
    """What error messages name as the function when the generate function set the reward."""
    path = getattr(getattr(cfg, "rollout", None), "custom_generate_function_path", None) or \
        "lean_rl.rollout.default.generate"
    module, _, name = path.rpartition(".")
    return types.SimpleNamespace(__module__=module, __qualname__=name)


def _set_reward(sample: Sample, value: float, entries: dict[str, float] | None, counters: collections.Counter) -> None:
    if entries is not None:
        sample.metadata["rewards"] = entries
    if math.isfinite(value):
        sample.reward = value
    else:  # one sample's computation went wrong (0/0, log 0): that sample fails, the run goes on
        _mark_failed(sample, ValueError(f"the reward is {value}, not a finite number"), counters)


def _mark_failed(sample: Sample, err: Exception, counters: collections.Counter) -> None:
    sample.reward = 0.0
    sample.status = Status.FAILED
    sample.metadata["reward_error"] = f"{type(err).__name__}: {err}"
    counters["reward_failed"] += 1


def reward_entry_means(samples: list[Sample]) -> dict[str, float]:
    """Mean of every entry of the reward dicts (metadata["rewards"]) over the samples that did not
    FAIL, by entry name (non-finite values left out)."""
    values: dict[str, list[float]] = collections.defaultdict(list)
    for sample in samples:
        entries = sample.metadata.get("rewards")
        if sample.status == Status.FAILED or not isinstance(entries, dict):
            continue
        for name, value in entries.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[name].append(float(value))
    return {name: sum(v) / len(v) for name, v in values.items()}
