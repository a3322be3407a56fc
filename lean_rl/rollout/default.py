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
import inspect
import logging
import time
from typing import TYPE_CHECKING

from lean_rl.rollout.base import RolloutOutput, installed_extensions
from lean_rl.rollout.evaluation import run_evaluation
from lean_rl.rollout.generate import generate  # also lean_rl.rollout.default.generate, the documented default
from lean_rl.rollout.group_runner import GroupRunner
from lean_rl.rollout.metrics import rollout_metrics
from lean_rl.sample import Sample

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config
    from lean_rl.hook_protocols import Extensions

logger = logging.getLogger(__name__)


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
    # each group's task puts itself here when done: one callback per task, where asyncio.wait on the
    # tasks still running would add and remove one per task at every finished group
    finished: asyncio.Queue[asyncio.Task] = asyncio.Queue()
    exhausted = False
    while len(kept) < target:
        # kept + in flight only falls below the target when the filter dropped groups: top up then
        if not exhausted and len(kept) + len(tasks) < target:
            groups = buffer.get_prompt_groups(launch_size)
            exhausted = len(groups) < launch_size
            for group in groups:
                task = asyncio.create_task(runner.run_group(group, claim_place))
                task.add_done_callback(finished.put_nowait)
                tasks.add(task)
        if not tasks:
            break  # data used up: return what was kept
        done = [await finished.get()]
        while not finished.empty():  # all that are done by now, as asyncio.wait would hand them over
            done.append(finished.get_nowait())
        for task in done:
            tasks.discard(task)
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
    extensions = installed_extensions(cfg)  # loaded once at start-up (lean_rl/extensions.py)
    if evaluation:
        return await run_evaluation(cfg, rollout_id, extensions, generate)
    return await _collect_batch(cfg, buffer, extensions, rollout_id)
