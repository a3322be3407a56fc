"""The default rollout: prompts from the buffer → SGLang (through the router) → rewards → filter → buffer.

    generate_rollout(cfg: Config, rollout_id: int, buffer: DataBuffer | None, evaluation: bool = False)
        -> RolloutOutput

One rollout collects `--rollout-batch-size` kept groups. It launches `--over-sampling-batch-size` groups
at once, tops up while a dynamic-sampling filter drops groups, and once enough are kept aborts the
surplus; aborted groups go back to the buffer (with their partial tokens under `--partial-rollout`,
reset otherwise), so no prompt is lost.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import statistics
import time
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient, EngineConnectionError, EngineHTTPError, EngineTimeoutError
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import (Extensions, RolloutOutput, filter_verdict, generated_samples, load_extensions,
                                  on_every_engine, parse_weight_version, router_client, set_stopping_event)
from lean_rl.rollout.evaluation import run_evaluation
from lean_rl.rollout.rewards import reward_entry_means, score_group
from lean_rl.sample import Sample, Status

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.backends.sglang.responses import GenerateResult
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config

FINISH_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


async def generate(cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """Default per-sample generate: one /generate call for what is left of the response budget.
    A sample that already holds partial tokens (an earlier abort) continues from them. Evaluation
    generates the same way (its sampling_params come from cfg.eval.sampling)."""
    budget = sampling_params["max_new_tokens"] - sample.response_length
    if budget <= 0:
        sample.status = Status.TRUNCATED
        return sample
    result = await generate_with_retries(cfg, sample.tokens, {**sampling_params, "max_new_tokens": budget},
                                         rid=f"lean_rl-{sample.index}-{sample.response_length}",
                                         on_retry=lambda err: count_retry(sample, err))
    sample.append_response(result.output_ids, log_probs=result.output_log_probs,
                           weight_versions=token_versions(result))
    sample.response = load_tokenizer(cfg.engines.model_path).decode(sample.response_tokens)
    sample.status = FINISH_TO_STATUS[result.finish_reason]
    return sample


async def generate_with_retries(cfg: Config, input_ids: list[int], sampling_params: dict, rid: str,
                                on_retry=None, routing_key: str | None = None,
                                engine: EngineClient | None = None) -> GenerateResult:
    """/generate through the router, retried when an engine dies under the request (the router answers
    5xx or drops the connection; the engine monitor restarts the engine meanwhile and the router sends
    the retry elsewhere). A failed request returned no tokens, so a retry duplicates nothing.
    `engine`: the first attempt goes to that engine directly (a session's own), retries to the router."""
    attempts = cfg.rollout.request_retries + 1
    for attempt in range(attempts):
        client = engine if engine is not None and attempt == 0 else router_client(cfg)
        try:
            return await client.generate(input_ids, sampling_params, return_logprob=True, rid=rid,
                                         routing_key=routing_key)
        except (EngineConnectionError, EngineTimeoutError, EngineHTTPError) as err:
            retryable = not isinstance(err, EngineHTTPError) or err.status_code >= 500
            if not retryable or attempt == attempts - 1:
                raise
            if on_retry is not None:
                on_retry(err)
            await asyncio.sleep(min(2.0**attempt, 30.0))
    raise AssertionError("unreachable")


def count_retry(sample: Sample, err: Exception) -> None:
    sample.metadata["generate_retries"] = sample.metadata.get("generate_retries", 0) + 1
    sample.metadata["last_generate_error"] = str(err)[:500]


def token_versions(result) -> list[int]:
    """Per output token, the policy version that generated it (SGLang reports spans when weights changed
    during the request; otherwise one version for all)."""
    versions = [parse_weight_version(result.weight_version)] * len(result.output_ids)
    for span in result.weight_version_spans:
        for i in range(max(span.start, 0), min(span.end, len(versions))):
            versions[i] = parse_weight_version(span.version)
    return versions


class GroupRunner:
    """Runs prompt groups to the end: generate every sample, score, filter, and hand the result to the
    buffer (finished, dropped, or back as partial). Shared by the per-step rollout below and by the
    continuous generator of fully async training (rollout/continuous.py)."""

    def __init__(self, cfg: Config, buffer: DataBuffer, extensions: Extensions, keep_partial_tokens: bool):
        self.cfg, self.buffer, self.ext = cfg, buffer, extensions
        self.keep_partial_tokens = keep_partial_tokens
        self.generate_fn = extensions.generate or generate
        self.generate_call = extensions.generate_call or generate
        self.semaphore = asyncio.Semaphore(cfg.rollout.max_concurrency)
        self.sampling_params = cfg.rollout.sampling.to_sglang()
        self.counters: collections.Counter = collections.Counter()
        self._stopping = asyncio.Event()  # set while what still runs is surplus: nothing new starts
        # every group that finished generating and was scored, kept or dropped by the filter, when
        # --rollout-all-samples-process-path wants them (the per-step rollout hands them over at its end)
        self.finished_groups: list[list[Sample]] | None = [] if extensions.all_samples_process else None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self._stopping.set() if value else self._stopping.clear()

    async def run_group(self, group: list[Sample], is_wanted=lambda: True) -> list[Sample] | None:
        """The group's samples if it was kept (now in the buffer as finished), else None.
        `is_wanted()` is asked once the group is scored and passed the filter; it claims a place in the
        batch (False: no place left, the group goes back to the buffer as surplus)."""
        set_stopping_event(self._stopping)  # this group's task: its generate calls see `rollout_stopping()`
        results = await asyncio.gather(*(self._run_sample(s) for s in group))
        # a generate that fans out returns several samples: all stay in the prompt's group (one baseline)
        samples = [s for r in results for s in generated_samples(self.cfg, self.generate_fn, r, group[0].group_index)]
        if len(samples) != len(group):
            self.counters["fanout_samples"] += len(samples) - len(group)
        if any(s.status in (Status.ABORTED, Status.PENDING) for s in samples):
            self._return_partial(group, samples)
            return None
        started = time.monotonic()
        # rewards the generate function set are kept; the reward function scores the others
        await score_group(self.cfg, samples, self.ext.reward, self.ext.group_reward, self.counters)
        if self.ext.reward is not None:
            self.counters["reward_seconds"] += time.monotonic() - started  # summed over groups, not wall
        elif not self.cfg.run.debug_rollout_only:  # training needs a reward on every sample: say so now
            unscored = [s.index for s in samples if s.reward is None and s.status != Status.FAILED]
            if unscored:
                raise ValueError(f"samples {unscored[:4]} have no reward and there is no reward function: set "
                                 "--rm-type or --custom-rm-path, or set sample.reward in the generate function")
        if self.ext.dynamic_filter is not None and not filter_verdict(
                self.cfg, self.ext.dynamic_filter, self.ext.dynamic_filter(self.cfg, samples)):
            self.buffer.drop_groups([samples], "filtered")
            self.counters["groups_filtered"] += 1
            self._record_finished(samples)
            return None
        if not is_wanted():
            self._return_partial(group, samples)  # finished after the batch filled: surplus
            return None
        self._record_finished(samples)
        self.buffer.put_finished_groups([samples])
        return samples

    def _record_finished(self, samples: list[Sample]) -> None:
        if self.finished_groups is not None:
            self.finished_groups.append(samples)

    async def _run_sample(self, sample: Sample):
        async with self.semaphore:
            if self.stopping or sample.status in (Status.COMPLETED, Status.TRUNCATED):
                return sample  # surplus never started, or finished before an earlier abort
            try:
                return await self.generate_call(self.cfg, sample, dict(self.sampling_params), False)
            except Exception as err:  # noqa: BLE001 - one bad request must not end the rollout
                sample.status = Status.FAILED
                sample.metadata["generate_error"] = f"{type(err).__name__}: {err}"
                self.counters["generate_failed"] += 1
                return sample

    def _return_partial(self, group: list[Sample], samples: list[Sample]) -> None:
        """Back to the buffer, to be handed out again first. With keep_partial_tokens samples keep what
        they generated (finished ones stay finished); otherwise, or when a custom generate turned one
        sample into several, the group starts over."""
        expanded = len(samples) != len(group)
        back = group if expanded else samples
        for s in back:
            if expanded or not self.keep_partial_tokens or s.status == Status.FAILED:
                s.reset_response()
            elif s.status == Status.ABORTED:
                s.status = Status.PENDING
        self.buffer.put_partial_groups([back])
        self.counters["groups_returned_partial"] += 1

    async def abort_all(self) -> None:
        # The router does not forward /abort_request: abort on every engine directly.
        await on_every_engine(self.cfg, lambda c: c.abort_request(abort_all=True))


def rollout_metrics(groups: list[list[Sample]], seconds: float | None = None,
                    counters: collections.Counter | dict | None = None) -> dict[str, float]:
    """The one source of rollout/* metrics about the generated groups (the trainer adds what it saw in
    the batch under other keys). Without `seconds` (a saved rollout, replayed): no timing metrics."""
    samples = [s for g in groups for s in g]
    statuses = collections.Counter(s.status.value for s in samples)
    n = max(len(samples), 1)
    response_tokens = sum(s.response_length for s in samples)
    # a FAILED sample (engine, router or reward fault) says nothing about the policy: left out, counted
    rewards = [s.reward for s in samples if s.reward is not None and s.status != Status.FAILED]
    entry_means = reward_entry_means(samples)  # a reward function that returned dicts: every entry
    metrics = {
        "rollout/groups": len(groups),
        "rollout/samples": len(samples),
        "rollout/response_len_mean": response_tokens / n,
        "rollout/response_tokens": response_tokens,
        "rollout/truncated_frac": statuses["truncated"] / n,
        **{f"rollout/{k}": float(v) for k, v in (counters or {}).items()},
    }
    if seconds is not None:
        metrics["rollout/seconds"] = seconds
        metrics["rollout/response_tokens_per_s"] = response_tokens / max(seconds, 1e-9)
    if rewards:
        metrics["rollout/reward_mean"] = sum(rewards) / len(rewards)
        metrics["rollout/reward_std"] = float(statistics.pstdev(rewards))
    metrics.update({f"rollout/reward/{name}_mean": mean for name, mean in entry_means.items()})
    # multi-turn samples (rollout/multi_turn.py, or any generate that records metadata["turns"])
    turns = [len(s.metadata["turns"]) for s in samples if isinstance(s.metadata.get("turns"), list)]
    if turns:
        metrics["rollout/turns_mean"] = sum(turns) / len(turns)
        metrics["rollout/turns_max"] = float(max(turns))
        metrics["rollout/environment_failed"] = float(sum(s.status == Status.FAILED and "environment_error" in s.metadata
                                                          for s in samples))
    return metrics


async def _collect_batch(cfg: Config, buffer: DataBuffer, extensions: Extensions, rollout_id: int) -> RolloutOutput:
    """One rollout: launch --over-sampling-batch-size groups, top up while the filter drops some, stop
    at --rollout-batch-size ready groups and send the surplus back to the buffer. Groups already ready
    count (a resume restores those of an interrupted rollout, or one-step's next rollout): a rollout
    fills the batch up, so no extra batch stays queued and ages past the loop's staleness."""
    started = time.monotonic()
    runner = GroupRunner(cfg, buffer, extensions, keep_partial_tokens=cfg.rollout.partial_rollout)
    carried = list(buffer.ready)[:cfg.rollout.rollout_batch_size]
    target, launch_size = cfg.rollout.rollout_batch_size - len(carried), cfg.rollout.over_sampling_batch_size
    kept: list[list[Sample]] = []
    places = [target]  # claimed synchronously by each kept group, so the batch never overfills

    def claim_place() -> bool:
        if places[0] == 0:
            return False
        places[0] -= 1
        return True

    tasks: set[asyncio.Task] = set()
    exhausted = False
    while len(kept) < target:
        # kept + in flight only falls below the target when the filter dropped groups: top up then
        if not exhausted and len(kept) + len(tasks) < target:
            groups = buffer.get_prompt_groups(launch_size)
            exhausted = len(groups) < launch_size
            tasks.update(asyncio.create_task(runner.run_group(g, claim_place)) for g in groups)
        if not tasks:
            break  # data used up: return what was kept
        done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if (samples := task.result()) is not None:  # .result(): a bug in our code must not pass silently
                kept.append(samples)
    if tasks:
        runner.stopping = True
        await runner.abort_all()  # only this rollout's requests run on the engines in the per-step modes
        await asyncio.gather(*tasks)
    if carried:
        runner.counters["carried_groups"] += len(carried)
    if extensions.all_samples_process is not None:  # every group finished here, kept or filtered out
        processed = extensions.all_samples_process(cfg, runner.finished_groups, rollout_id)
        if inspect.isawaitable(processed):
            await processed
    return RolloutOutput(metrics=rollout_metrics(carried + kept, time.monotonic() - started, runner.counters))


async def generate_rollout(cfg: Config, rollout_id: int, buffer: DataBuffer | None,
                           evaluation: bool = False) -> RolloutOutput:
    extensions = load_extensions(cfg)
    if evaluation:
        return await run_evaluation(cfg, rollout_id, extensions, generate)
    return await _collect_batch(cfg, buffer, extensions, rollout_id)
