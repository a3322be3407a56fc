"""The generic multi-turn generate: the model and an environment (`--environment-path`) take turns.

    model turn (SGLang /generate on the ids so far) -> env.step(text) -> observation ids -> model turn ...

Token in, token out: the prompt of turn k+1 is exactly the ids of turns <= k (the model's sampled ids
as the engine returned them, the observations' ids as rendered once) plus the new observation's. No
earlier turn is re-tokenized, so nothing drifts between what was sampled and what is trained.
Model tokens carry loss mask 1 with their rollout log-probs and weight versions; observation tokens
loss mask 0. Every turn of a trajectory goes to one engine (session affinity, below), whose prefix
cache holds the turns so far.

Ends: the environment says done (COMPLETED); the response budget (--rollout-max-response-len, model
and observation tokens together) or --max-turns runs out (TRUNCATED, metadata["stop_reason"]); the
environment raises, answers the wrong type or exceeds --environment-timeout (FAILED,
metadata["environment_error"]); weights change under a turn (ABORTED: the trajectory restarts from the
prompt, since an environment's state cannot be rewound). Per-step rewards are summed into
sample.reward. An episode the environment gave no reward is left for the reward function
(--rm-type / --custom-rm-path) when there is one, and earns 0 when there is none.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import policy_client, rollout_stopping, serving_engine_urls
from lean_rl.rollout.blocking import run_blocking
from lean_rl.rollout.generate import count_retry, generate_with_retries, token_versions
from lean_rl.rollout.vision import engine_prompt
from lean_rl.rollout.environment import ObservationRenderer, as_observation, as_step_result
from lean_rl.sample import Sample, Status
from lean_rl.rollout.config import MULTI_TURN_GENERATE
from lean_rl.utils.plugins import PluginError, load_function
from lean_rl.utils.token_text import decode_ids

if TYPE_CHECKING:
    from lean_rl.config import Config


class EnvironmentFailed(Exception):
    """The environment failed (raised, timed out, answered the wrong type): the sample fails."""


# what one attempt writes into sample.metadata; an attempt that starts over clears it
_ATTEMPT_KEYS = ("turns", "stop_reason", "environment_error", "environment_close_error", "prompt_length_before_reset")


async def generate(cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    mt = cfg.rollout.multi_turn
    _start_over(sample)  # an aborted or failed trajectory starts over: an environment cannot be rewound
    tokenizer = load_tokenizer(cfg.engines.model_path)
    renderer = _renderer(cfg.engines.model_path, cfg.data.apply_chat_template)
    budget = sampling_params["max_new_tokens"]
    turns: list[dict] = []
    sample.metadata["turns"] = turns
    rewards: list[float] = []
    env = None
    try:
        env = await _call(cfg, "make_env", _make_env(mt.environment_path), cfg, sample)
        first = await _call(cfg, "reset", getattr(env, "reset", None), sample)
        if (first := _checked(as_observation, first, "reset")) is not None:
            prompt = _checked(renderer.prompt_with, sample.tokens, first)
            sample.metadata["prompt_length_before_reset"] = len(sample.tokens)
            sample.tokens[:] = prompt  # still no response: the observation joins the prompt
        while True:
            left = budget - sample.response_length
            if left <= 0:
                return _end(cfg, sample, Status.TRUNCATED, "response_budget", rewards, tokenizer)
            if rollout_stopping():  # surplus (the batch is full, or weights are changing): no new turn
                _start_over(sample)
                sample.status = Status.ABORTED
                return sample
            max_new = min(left, mt.max_tokens_per_turn or left)
            input_len = len(sample.tokens)
            result = await generate_with_retries(
                cfg, engine_prompt(cfg.engines.model_path, sample), {**sampling_params, "max_new_tokens": max_new},
                rid=f"lean_rl-{sample.index}-turn{len(turns)}", on_retry=lambda err: count_retry(sample, err),
                routing_key=f"lean_rl-group-{sample.group_index}",
                engine=await session_engine(cfg, sample.group_index))
            turns.append({"input_tokens": input_len, "engine_prompt_tokens": result.prompt_tokens,
                          "cached_tokens": result.cached_tokens, "output_tokens": len(result.output_ids),
                          "finish_reason": result.finish_reason})
            if result.aborted:
                _start_over(sample)
                sample.status = Status.ABORTED
                return sample
            sample.append_response(result.output_ids, log_probs=result.output_log_probs,
                                   weight_versions=token_versions(result), routed_experts=result.routed_experts)
            if result.finish_reason == "length" and max_new == left:
                return _end(cfg, sample, Status.TRUNCATED, "response_budget", rewards, tokenizer)
            action = tokenizer.decode(result.output_ids, skip_special_tokens=True)
            step = _checked(as_step_result, await _call(cfg, "step", getattr(env, "step", None), action))
            if step.reward is not None:
                rewards.append(float(step.reward))
            if step.info:
                turns[-1]["info"] = step.info
            if step.done:
                return _end(cfg, sample, Status.COMPLETED, "done", rewards, tokenizer)
            if len(turns) >= mt.max_turns:
                return _end(cfg, sample, Status.TRUNCATED, "max_turns", rewards, tokenizer)
            if step.observation is None:
                raise EnvironmentFailed("step returned no observation for an episode that is not done")
            ids, text = renderer.ids(step.observation, turn_end=_turn_end(result, tokenizer))
            if len(ids) > budget - sample.response_length:
                return _end(cfg, sample, Status.TRUNCATED, "response_budget", rewards, tokenizer)
            sample.append_response(ids, text, trainable=False)
    except EnvironmentFailed as err:
        sample.status = Status.FAILED
        sample.metadata["environment_error"] = str(err)[:1000]
        return sample
    finally:
        if env is not None and hasattr(env, "close"):
            try:
                await _call(cfg, "close", env.close)
            except EnvironmentFailed as err:
                sample.metadata["environment_close_error"] = str(err)[:1000]


def _start_over(sample: Sample) -> None:
    """Back to the prompt as the buffer handed it out: no response, no observation of reset, no record
    of an earlier attempt."""
    if sample.response_length:
        sample.reset_response()
    if "prompt_length_before_reset" in sample.metadata:
        del sample.tokens[sample.metadata["prompt_length_before_reset"]:]
    for key in _ATTEMPT_KEYS:
        sample.metadata.pop(key, None)


def _turn_end(result, tokenizer) -> str:
    """The text of the token that ended a model turn (eos or a --rollout-stop-token-ids token; SGLang
    reports it as the matched id), "" when the turn ended otherwise."""
    if result.finish_reason == "stop" and isinstance(result.finish_detail, int):
        return tokenizer.decode([result.finish_detail])
    return ""


def _checked(convert, *args):
    """`convert(*args)` on what the environment returned; its TypeError / ValueError fail the sample."""
    try:
        return convert(*args)
    except (TypeError, ValueError) as err:
        raise EnvironmentFailed(str(err)) from None


def _end(cfg: Config, sample: Sample, status: Status, reason: str, rewards: list[float], tokenizer) -> Sample:
    sample.status = status
    sample.metadata["stop_reason"] = reason
    sample.response = decode_ids(tokenizer, sample.response_tokens)
    if sample.reward is None and (rewards or not (cfg.reward.rm_type or cfg.reward.custom_rm_path)):
        sample.reward = sum(rewards)  # no reward function: an episode the environment never rewarded earns 0
    return sample


async def _call(cfg: Config, what: str, fn, *args):
    """One environment call, bounded by --environment-timeout; its failures become EnvironmentFailed.
    A plain `def` runs on the pool of threads for blocking user code (rollout/blocking.py), so it
    neither blocks the rollout's event loop nor escapes the deadline, and one that hangs takes no
    thread a train step, a sync or the exit needs."""
    mt = cfg.rollout.multi_turn
    if not callable(fn):
        raise EnvironmentFailed(f"the environment has no {what}() method (--environment-path: see "
                                "lean_rl/rollout/environment.py)")
    try:
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
            return await asyncio.wait_for(fn(*args), mt.environment_timeout)
        result = await asyncio.wait_for(run_blocking(cfg, fn, *args), mt.environment_timeout)
        if inspect.isawaitable(result):  # a plain function that returned a coroutine
            result = await asyncio.wait_for(result, mt.environment_timeout)
        return result
    except asyncio.TimeoutError:
        raise EnvironmentFailed(f"environment {what} took longer than --environment-timeout "
                                f"{mt.environment_timeout:g} s") from None
    except Exception as err:  # noqa: BLE001 - a failing environment fails its sample, not the rollout
        raise EnvironmentFailed(f"environment {what} raised {type(err).__name__}: {err}") from err


# ---------------------------------------------------------------- session affinity
# The turns of a trajectory go to one engine, whose prefix cache holds the turns so far; the samples of
# a group share it too (one prompt). The engine is picked among those the router serves now (its
# healthy workers: a restarted engine is listed only once it has the trainer's weights), by group, and
# asked directly; a failed call is retried through the router. Any router policy keeps this.
async def session_engine(cfg: Config, group_index: int) -> EngineClient | None:
    """The engine of group `group_index`'s sessions; None (use the router) when it cannot say."""
    workers = await serving_engine_urls(cfg)
    if not workers:
        return None
    return policy_client(cfg, workers[group_index % len(workers)])


@functools.lru_cache(maxsize=8)
def _make_env(path: str):
    return load_function(path, "--environment-path", num_args=2, must_be_sync=True)


@functools.lru_cache(maxsize=8)
def _renderer(model_path: str, chat: bool) -> ObservationRenderer:
    return ObservationRenderer(load_tokenizer(model_path), chat)


def check_environment(cfg: Config) -> None:
    """Start-up check of --environment-path (given; importable; a plain callable of (cfg, sample))."""
    if not cfg.rollout.multi_turn.environment_path:
        raise PluginError(f"--custom-generate-function-path {MULTI_TURN_GENERATE} needs --environment-path "
                          "(the environment the model talks to)")
    _make_env(cfg.rollout.multi_turn.environment_path)
