"""Built-in reward functions (`--rm-type`); the wrapper that keeps a failing reward from stopping a run is
reward_scoring.py.

Every reward function has the signature `async def reward(cfg: Config, sample: Sample) -> float`; a group
reward (`--group-rm`) is `async def reward(cfg: Config, samples: list[Sample]) -> list[float]` (the
RewardFunction / GroupRewardFunction protocols in lean_rl/hook_protocols.py; docs/extending.md). A user reward may
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
from typing import TYPE_CHECKING

import httpx

# score_group lives in reward_scoring.py; a user's rollout function imports it from here (docs/extending.md)
from lean_rl.rollout.reward_scoring import never_waits, score_group  # noqa: F401
from lean_rl.sample import Sample
from lean_rl.utils.env_keys import bearer_header

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.config import Config
    from lean_rl.hook_protocols import RewardFunction


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


@never_waits
async def exact_reward(cfg: Config, sample: Sample) -> float:
    return exact_match(sample.response, sample.label)


@never_waits
async def boxed_reward(cfg: Config, sample: Sample) -> float:
    return boxed_match(sample.response, sample.label)


@never_waits
async def f1_reward(cfg: Config, sample: Sample) -> float:
    return token_f1(sample.response, sample.label)


# ---------------------------------------------------------------- remote reward model
async def remote_reward(cfg: Config, sample: Sample) -> float:
    """POST {prompt, response, label, metadata} to --rm-url (with --rm-api-key-env's key as a Bearer
    header); the server answers a number or {"reward": x}."""
    body = {"prompt": sample.prompt, "response": sample.response, "label": sample.label, "metadata": sample.metadata}
    last_error: Exception | None = None
    headers = bearer_header(cfg.reward.rm_api_key_env, "--rm-api-key-env")  # the key to --rm-url alone
    async with httpx.AsyncClient(timeout=cfg.reward.rm_timeout) as client:
        for attempt in range(cfg.reward.rm_retries + 1):
            try:
                reply = await client.post(cfg.reward.rm_url, json=body, headers=headers)
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


