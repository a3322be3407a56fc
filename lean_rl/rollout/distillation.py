"""On-policy distillation (OPD), rollout side: the teacher's scoring of the student's samples (its
flags and engine settings: distillation_config.py). The advantage it feeds is
lean_rl/algorithms/distillation.py.

    --use-opd --opd-type sglang --opd-teacher-hf-checkpoint DIR [--opd-teacher-num-engines N] [--opd-kl-coef C]
    --use-opd --opd-type sglang --opd-teacher-url http://HOST:PORT    (a teacher server or router of your own)
    (--opd-type megatron --opd-teacher-load DIR: the trainer scores instead, train_driver._teacher_scores)

With a checkpoint, the run serves the teacher itself: a second EngineGroup (its own servers and
router, started and stopped with the student's, never given weight updates), whose CPU servers share
the cores with the student's (--engine-cpu-threads' default counts both). After generation, every
sample that did not fail is scored by one forward pass of the teacher over prompt + response
(`EngineClient.score`: SGLang's input-token log-probs); the last response_length of them are the
sample's `teacher_log_probs`, and under --opd-estimator topk (the default) the teacher's --opd-top-k
likeliest tokens at each of those positions are its `teacher_top_ids` / `teacher_top_log_probs`. A teacher that cannot answer (after --rollout-request-retries) marks the
sample FAILED with metadata["teacher_error"]: a fault is never training data.

The teacher's log-probs are at temperature 1 (SGLang 0.5.23 does not scale input-token log-probs by
the request's temperature), the student's at --rollout-temperature: keep it 1 for a true reverse KL.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.client_errors import EngineError
from lean_rl.backends.sglang.responses import ScoreResult
from lean_rl.rollout.base import engine_client, retry_engine_call
from lean_rl.sample import Sample, Status

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group (Megatron's included)
    from pathlib import Path

    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.config import Config

TEACHER_ERROR = "teacher_error"  # metadata key of a sample the teacher could not score (FAILED)


def teacher_engine_group(cfg: Config, output_dir: Path) -> EngineGroup | None:
    """The teacher's own engine group when this run serves it (--opd-teacher-hf-checkpoint), not yet
    started (engine_start.py starts it beside the policy's); never synced nor probed: its weights stay
    as loaded. None with --opd-teacher-url or without --use-opd."""
    from lean_rl.backends.sglang.engines import EngineGroup

    teacher = cfg.distillation.teacher_engines
    return None if teacher is None else EngineGroup(teacher, output_dir / "teacher_engines", name="teacher_engines")


def teacher_client(cfg: Config) -> EngineClient:
    opd = cfg.distillation
    if opd.teacher_url is not None:
        return engine_client(opd.teacher_url, cfg.engines.request_timeout_s, None)
    engines = opd.teacher_engines
    return engine_client(engines.router_url, engines.request_timeout_s, engines.api_key)


async def teacher_scores(cfg: Config, input_ids: list[int]) -> ScoreResult:
    """log p_teacher(input_ids[j] | input_ids[:j]) for j >= 1 (and under --opd-estimator topk the
    teacher's --opd-top-k likeliest tokens there), retried like generation (--rollout-request-retries)
    when the teacher cannot be reached, times out or answers 5xx."""
    async def attempt(number: int) -> ScoreResult:
        return await teacher_client(cfg).score(input_ids, top_k=cfg.distillation.top_k_if_used)

    return await retry_engine_call(cfg, attempt)


async def score_with_teacher(cfg: Config, samples: list[Sample]) -> int:
    """Set `teacher_log_probs` (and under --opd-estimator topk `teacher_top_ids` / `teacher_top_log_probs`)
    on every sample that did not fail and has a response the teacher has not scored; a sample the teacher could not score becomes FAILED (metadata["teacher_error"]). Returns
    how many failed here."""
    todo = [s for s in samples if s.status != Status.FAILED and s.response_length and not s.teacher_log_probs]
    if any(s.multimodal_inputs is not None for s in todo):  # its /generate scoring would read the pads as text
        raise ValueError("--use-opd: the teacher scores token ids only; image samples (--multimodal-keys) are not "
                         "supported yet (docs/vlm.md)")
    results = await asyncio.gather(*(teacher_scores(cfg, s.tokens) for s in todo), return_exceptions=True)
    failed = 0
    for sample, result in zip(todo, results):
        if isinstance(result, EngineError):
            sample.status = Status.FAILED
            sample.metadata[TEACHER_ERROR] = f"{type(result).__name__}: {result}"[:2000]
            failed += 1
        elif isinstance(result, BaseException):
            raise result  # a bug, not a fault of the teacher
        else:
            n = sample.response_length
            sample.teacher_log_probs = [float(x) for x in result.log_probs[-n:]]
            if result.top_ids:
                sample.teacher_top_ids, sample.teacher_top_log_probs = result.top_ids[-n:], result.top_log_probs[-n:]
    return failed


async def score_group_with_teacher(cfg: Config, samples: list[Sample], counters) -> None:
    """score_with_teacher for one group of the default rollout, counted in `counters`
    (rollout/teacher_seconds: summed over groups, not wall time; rollout/teacher_failed)."""
    started = time.monotonic()
    failed = await score_with_teacher(cfg, samples)
    counters["teacher_seconds"] += time.monotonic() - started
    if failed:
        counters["teacher_failed"] += failed
