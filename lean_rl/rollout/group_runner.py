"""Runs prompt groups to the end (GroupRunner): generate every sample, score, filter, hand the result
to the buffer (finished, dropped, or back as partial). Shared by the per-step default rollout
(default.py) and the continuous generator of fully async training (continuous.py)."""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import time
from typing import TYPE_CHECKING

from lean_rl.rollout.base import filter_verdict, generated_samples, on_every_engine, set_stopping_event
from lean_rl.rollout.distillation import score_group_with_teacher
from lean_rl.rollout.generate import generate
from lean_rl.rollout.reward_scoring import score_group
from lean_rl.sample import REMAX_BASELINE_REWARD, Sample, Status

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config
    from lean_rl.hook_protocols import Extensions

logger = logging.getLogger(__name__)

# A group's greedy baseline (--advantage-estimator remax) is a Sample that never enters the buffer; its
# index (seen by generate functions: request ids, sessions) counts down from here while the buffer's
# count up from 0, below 2**40 as openai_capture's fan-out indices need
GREEDY_BASELINE_TOP_INDEX = 2**40 - 1
# what an earlier attempt of the prompt's first sample left in its metadata: not the greedy baseline's
_ATTEMPT_METADATA = ("generate_retries", "last_generate_error", "generate_error", "reward_error", "rewards",
                     REMAX_BASELINE_REWARD)


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
        # --use-opd: pure distillation needs no reward function; with --opd-type sglang the teacher scores
        # every generated sample here (rollout/distillation.py), with megatron the trainer runs it
        self.distill = getattr(getattr(cfg, "distillation", None), "use_opd", False)
        self.teacher_scores = getattr(getattr(cfg, "distillation", None), "scores_in_rollout", False)
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
        if self.teacher_scores:  # before the rewards: a reward function may read sample.teacher_log_probs
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
