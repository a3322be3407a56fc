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
import copy
import inspect
import logging
import statistics
import time
import zlib
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import (Extensions, RolloutOutput, engine_client, filter_verdict, generated_samples,
                                  load_extensions, on_every_engine, parse_weight_version, retry_engine_call,
                                  router_client, serving_engine_urls, set_stopping_event)
from lean_rl.rollout.distillation import score_group_with_teacher
from lean_rl.rollout.evaluation import run_evaluation
from lean_rl.rollout.rewards import reward_entry_means, score_group
from lean_rl.sample import REMAX_BASELINE_REWARD, Sample, Status

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from lean_rl.backends.sglang.responses import GenerateResult
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config

logger = logging.getLogger(__name__)

FINISH_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}
# A group's greedy baseline (--advantage-estimator remax) is a Sample that never enters the buffer; its
# index (seen by generate functions: request ids, sessions) counts down from here while the buffer's
# count up from 0, below 2**40 as openai_capture's fan-out indices need
GREEDY_BASELINE_TOP_INDEX = 2**40 - 1
# what an earlier attempt of the prompt's first sample left in its metadata: not the greedy baseline's
_ATTEMPT_METADATA = ("generate_retries", "last_generate_error", "generate_error", "reward_error", "rewards",
                     REMAX_BASELINE_REWARD)


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
                                         on_retry=lambda err: count_retry(sample, err),
                                         # replay's direct engine calls: a prompt's samples share an engine
                                         routing_key=(f"lean_rl-group-{sample.group_index}"
                                                      if cfg.engines.return_routed_experts else None))
    sample.append_response(result.output_ids, log_probs=result.output_log_probs,
                           weight_versions=token_versions(result), routed_experts=result.routed_experts)
    sample.response = load_tokenizer(cfg.engines.model_path).decode(sample.response_tokens)
    sample.status = FINISH_TO_STATUS[result.finish_reason]
    return sample


async def generate_with_retries(cfg: Config, input_ids: list[int], sampling_params: dict, rid: str,
                                on_retry=None, routing_key: str | None = None,
                                engine: EngineClient | None = None) -> GenerateResult:
    """/generate through the router, retried when an engine dies under the request (the router answers
    5xx or drops the connection; the engine monitor restarts the engine meanwhile and the router sends
    the retry elsewhere). A failed request returned no tokens, so a retry duplicates nothing.
    `engine`: the first attempt goes to that engine directly (a session's own), retries to the router.
    Under --use-rollout-routing-replay every request asks for the experts of all its tokens, and goes to
    an engine directly (routes_engine)."""
    async def attempt(number: int) -> GenerateResult:
        if engine is not None and number == 0:
            client = engine
        elif cfg.engines.return_routed_experts:
            client = await routes_engine(cfg, routing_key or rid, number)
        else:
            client = router_client(cfg)
        return await client.generate(input_ids, sampling_params, return_logprob=True, rid=rid,
                                     routing_key=routing_key, return_routed_experts=cfg.engines.return_routed_experts)

    return await retry_engine_call(cfg, attempt, on_retry)


async def routes_engine(cfg: Config, key: str, attempt: int) -> EngineClient:
    """sglang-router 0.3.2 rebuilds a /generate body from the fields it knows, and return_routed_experts is
    not one of them (its GenerateRequest), so the engine would never be asked for routes. Requests that
    need them go straight to one of the engines the router serves now (rollout/base.py
    serving_engine_urls), picked by `key` (a session's routing key, else the request id: spread like the
    router's round robin), the next one on each retry; to the router only when it cannot name them."""
    workers = await serving_engine_urls(cfg)
    if not workers:
        return router_client(cfg)
    url = workers[(zlib.crc32(key.encode()) + attempt) % len(workers)]
    return engine_client(url, cfg.engines.request_timeout_s, cfg.engines.api_key)


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
        # --advantage-estimator remax: each group also generates and scores its prompt's greedy response
        self.greedy_baseline = getattr(getattr(cfg, "algorithm", None), "advantage_estimator", None) == "remax"
        # --use-opd: the teacher scores every generated sample (rollout/distillation.py)
        self.distill = getattr(getattr(cfg, "distillation", None), "use_opd", False)
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
        runs = [self._run_sample(s) for s in group]
        if self.greedy_baseline:  # beside the group's samples, so it adds no latency
            runs.append(self._run_greedy_baseline(greedy_baseline_sample(group[0])))  # copied before any generate
        results = await asyncio.gather(*runs)
        baseline = results.pop() if self.greedy_baseline else None
        # a generate that fans out returns several samples: all stay in the prompt's group (one baseline)
        samples = [s for r in results for s in generated_samples(self.cfg, self.generate_fn, r, group[0].group_index)]
        if len(samples) != len(group):
            self.counters["fanout_samples"] += len(samples) - len(group)
        if any(s.status in (Status.ABORTED, Status.PENDING) for s in samples) or baseline is Status.ABORTED:
            self._return_partial(group, samples)  # an interrupted baseline is generated again next time
            return None
        if baseline is Status.FAILED:  # advantages without their baseline would be wrong: no training data
            self.buffer.drop_groups([samples], "remax_baseline_failed")
            self.counters["remax_baseline_failed"] += 1
            return None
        if baseline is not None:
            for s in samples:
                s.metadata[REMAX_BASELINE_REWARD] = baseline
        if self.distill:  # before the rewards: a reward function may read sample.teacher_log_probs
            await score_group_with_teacher(self.cfg, samples, self.counters)
        started = time.monotonic()
        # rewards the generate function set are kept; the reward function scores the others
        await score_group(self.cfg, samples, self.ext.reward, self.ext.group_reward, self.counters)
        if self.ext.reward is not None:
            self.counters["reward_seconds"] += time.monotonic() - started  # summed over groups, not wall
        elif self.distill:  # pure distillation: the teacher's log-probs are the only signal, every reward 0
            for s in samples:
                s.reward = 0.0 if s.reward is None else s.reward
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

    async def _run_greedy_baseline(self, baseline: Sample) -> float | Status | None:
        """ReMax's baseline: the prompt's greedy (temperature 0) response, through the same generate
        function and reward as the group, never trained. Returns its reward (the mean when the generate
        fans out; None when nothing scores it: no reward function, and the generate set none),
        Status.ABORTED when it was interrupted or never started (surplus), or Status.FAILED when its
        generation or reward failed (a --group-rm reward scores it as a group of one)."""
        async with self.semaphore:
            if self.stopping:
                return Status.ABORTED
            try:
                result = await self.generate_call(self.cfg, baseline, {**self.sampling_params, "temperature": 0.0},
                                                  False)
            except Exception as err:  # noqa: BLE001 - one bad request must not end the rollout
                logger.warning("group %d: its greedy baseline failed (%s: %s); the group is dropped",
                               baseline.group_index, type(err).__name__, err)
                return Status.FAILED
        greedy = generated_samples(self.cfg, self.generate_fn, result, baseline.group_index)
        if any(s.status in (Status.ABORTED, Status.PENDING) for s in greedy):
            return Status.ABORTED
        await score_group(self.cfg, greedy, self.ext.reward, self.ext.group_reward, collections.Counter())
        if failed := [s for s in greedy if s.status == Status.FAILED]:
            logger.warning("group %d: its greedy baseline failed (%s); the group is dropped", baseline.group_index,
                           failure_note(failed[0]))
            return Status.FAILED
        if any(s.reward is None for s in greedy):
            # pure distillation (--use-opd, no reward function): every reward is 0, the baseline's too
            return 0.0 if self.distill and self.ext.reward is None else None
        return sum(s.reward for s in greedy) / len(greedy)

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


def failure_note(sample: Sample) -> str:
    """The first `*error` entry of a FAILED sample's metadata."""
    return next((f"{k}: {str(v)[:300]}" for k, v in sample.metadata.items() if k.endswith("error")), "no *error in metadata")


def greedy_baseline_sample(first: Sample) -> Sample:
    """A fresh sample of the prompt of `first` (same tokens, label, metadata; no response) under an index
    no buffer sample has: the greedy baseline of its group (--advantage-estimator remax)."""
    baseline = copy.deepcopy(first)
    baseline.reset_response()
    baseline.index = GREEDY_BASELINE_TOP_INDEX - first.group_index
    for key in _ATTEMPT_METADATA:
        baseline.metadata.pop(key, None)
    return baseline


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
    # --advantage-estimator remax: the greedy response's reward, once per prompt (the sampled ones' baseline)
    greedy = [g[0].metadata[REMAX_BASELINE_REWARD] for g in groups if g and REMAX_BASELINE_REWARD in g[0].metadata]
    if greedy:
        metrics["rollout/remax_baseline_reward_mean"] = sum(greedy) / len(greedy)
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
