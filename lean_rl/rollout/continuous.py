"""Generation that never waits for training (fully async mode, `--async-mode full`).

Groups are kept in flight continuously and land in the buffer as they finish. Staleness is bounded
by admission control, as in AReaL: at policy version v, at most (v - v0 + max_staleness + 1) x
rollout_batch_size new prompt groups may have been started since the generator started at version v0,
so nothing generated can be more than --max-staleness versions behind the policy that trains on it
(the buffer's staleness check catches what admission could not, e.g. a partial group that waited
long). A weight update pauses the engines (`pause`) and generation continues on the new weights
(`resume`): with the default pause mode (retract) running requests wait in the engine and finish on
the new weights, SGLang reporting per-token version spans; with abort they return with their tokens
and the samples resume as partial rollouts. Either way every token keeps the version that made it.
"""

from __future__ import annotations

import asyncio
import time

from lean_rl.rollout.base import on_every_engine
from lean_rl.rollout.group_runner import GroupRunner
from lean_rl.sample import Sample, Status


class ContinuousGenerator:
    def __init__(self, cfg, buffer, extensions, start_version: int, pause_mode: str = "retract"):
        if cfg.rollout.max_staleness is None:
            raise ValueError("continuous generation needs --max-staleness")
        self.cfg, self.buffer = cfg, buffer
        self.runner = GroupRunner(cfg, buffer, extensions, keep_partial_tokens=True)
        self.pause_mode = pause_mode
        self.version = self.start_version = start_version
        self.max_in_flight = cfg.rollout.over_sampling_batch_size  # prompt groups generating at once
        self._issued_at_start = buffer.get_counters().get("prompts_issued", 0)
        self._open = asyncio.Event()
        self._open.set()
        self._changed = asyncio.Event()  # version bumped or gate reopened: look for work again
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._loop_task: asyncio.Task | None = None
        self.idle_s = 0.0  # time with no group in flight (the engines had nothing of ours to do)
        self.data_exhausted = False

    # ------------------------------------------------------------ control (from the training loop)
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="lean_rl-continuous-generation")

    def check_alive(self) -> None:
        """Raise the generator's error, if it died (call while waiting on it)."""
        if self._loop_task is not None and self._loop_task.done():
            self._loop_task.result()
            if not self._stopping:
                raise RuntimeError("the continuous generator stopped unexpectedly")

    async def next_batch(self, step: int) -> tuple[list[list[Sample]], dict[str, float]]:
        """The groups of a batch fresh enough for policy version `step` (the buffer requeues stale
        ones), waiting (bounded) while they generate; and the runner's counters since the last batch."""
        # --rollout-timeout, as in the per-step modes: what one rollout (a batch) may take
        need, timeout_s = self.cfg.rollout.rollout_batch_size, self.cfg.rollout.timeout_s
        deadline = time.monotonic() + timeout_s
        groups: list[list[Sample]] = []
        while len(groups) < need:
            self.check_alive()
            groups += self.buffer.get_train_groups(need - len(groups), policy_version=step)
            if len(groups) >= need:
                break
            if self.data_exhausted and self.buffer.num_ready() == 0 and self.buffer.num_in_flight() == 0:
                raise RuntimeError(f"step {step}: the prompt data is used up ({len(groups)} of {need} groups)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step}: no batch of {need} groups within --rollout-timeout {timeout_s:g} s "
                                   f"(have {len(groups)}); nothing of it was trained (raise --rollout-timeout if "
                                   "rollouts are this long)")
            await asyncio.sleep(0.05)
        counters = dict(self.counters)
        self.counters.clear()
        return groups, counters

    async def pause(self) -> None:
        """Send nothing new and pause the engines (before a weight update). Requests the pause
        interrupts come back with their tokens and land in the buffer as partial groups while the
        weights change; one that slipped in after the pause waits in the engine and runs on the new
        weights after resume (its tokens then carry the new version)."""
        self._open.clear()
        self.runner.stopping = True
        await on_every_engine(self.cfg, lambda c: c.pause_generation(self.pause_mode))

    async def resume(self, version: int) -> None:
        """The engines now serve `version`: continue generating, admitting by the new version."""
        self.version = version
        await on_every_engine(self.cfg, lambda c: c.continue_generation())
        self.runner.stopping = False
        self._open.set()
        self._changed.set()

    async def stop(self) -> None:
        """Abort what is in flight and end the loop; engines a pause left paused generate again (a
        trainer heal stops the generator mid-sync and probes the engines next)."""
        paused = not self._open.is_set()
        self._stopping = True
        self._open.set()
        self._changed.set()
        if self._tasks:
            self.runner.stopping = True
            await self.runner.abort_all()
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True),
                                   self.cfg.engines.request_timeout_s)
        if self._loop_task is not None:
            await asyncio.wait_for(self._loop_task, 30)
        if paused:
            await on_every_engine(self.cfg, lambda c: c.continue_generation())

    @property
    def counters(self):
        return self.runner.counters

    # ------------------------------------------------------------ the loop
    async def _run_group_within_deadline(self, group: list[Sample]) -> None:
        """One group, bounded by --rollout-timeout as a whole rollout is in the per-step modes. Past it
        the group is cancelled (its HTTP requests are closed: SGLang aborts a request whose client went
        away), its samples are FAILED and it is dropped: counted (rollout/groups_timed_out), never
        trained. Its prompt is not handed out again, as a failed sample's is not."""
        timeout_s = self.cfg.rollout.timeout_s
        try:
            await asyncio.wait_for(self.runner.run_group(group), timeout_s)
        except asyncio.TimeoutError:
            for sample in group:
                sample.reset_response()  # cut anywhere: whatever it held is not kept
                sample.status = Status.FAILED
                sample.metadata["generate_error"] = f"the group did not finish within --rollout-timeout {timeout_s:g} s"
            self.buffer.drop_groups([group], "timed_out")
            self.counters["groups_timed_out"] += 1

    def admissible_new_groups(self) -> int:
        allowed = (self.version - self.start_version + self.cfg.rollout.max_staleness + 1) * self.cfg.rollout.rollout_batch_size
        issued = self.buffer.get_counters().get("prompts_issued", 0) - self._issued_at_start
        return max(allowed - issued, 0)

    async def _run(self) -> None:
        while not self._stopping:
            await self._open.wait()
            if self._stopping:
                break
            room = self.max_in_flight - len(self._tasks)
            if room > 0:
                groups = self.buffer.get_prompt_groups(room, max_new=self.admissible_new_groups())
                for group in groups:
                    task = asyncio.create_task(self._run_group_within_deadline(group))
                    self._tasks.add(task)
                if not groups and not self._tasks and self.admissible_new_groups() > 0:
                    self.data_exhausted = True  # allowed to start more, but the data is used up
            self._changed.clear()
            idle_since = time.monotonic() if not self._tasks else None
            waiters = [asyncio.create_task(self._changed.wait())]
            done, _ = await asyncio.wait([*self._tasks, *waiters], timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if idle_since is not None:
                self.idle_s += time.monotonic() - idle_since
            for task in [t for t in done if t in self._tasks]:
                self._tasks.discard(task)
                task.result()  # a bug in our code must not pass silently
