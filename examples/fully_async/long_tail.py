"""A long-tailed response-length workload for the tiny model (examples/fully_async).

Reasoning models produce a few responses far longer than the rest; a tiny random model does not.
This generate *simulates* that: each sample gets a token budget drawn, seeded by its index (so a
regenerated sample, and the same sample in a sync and an async run, gets the same budget), from

    short (95%): 6..12 tokens              -- stops at the budget or at its own end-of-sequence
    long   (5%): the short budget x 10..20 -- 60..240 tokens, with ignore_eos so it really is that long

both capped at --rollout-max-response-len. With 64 samples per step, almost every batch holds a few
long ones: a synchronous step waits for them; the fully async loop trains on the groups that are done.

    --custom-generate-function-path long_tail.generate   (examples/fully_async on PYTHONPATH)

Evaluation (evaluation=True) generates unchanged: the tail is a property of the training workload.
"""

from __future__ import annotations

import random

from lean_rl.rollout.default import generate as default_generate

SHORT_TOKENS = (6, 12)
LONG_FRACTION = 0.05
LONG_FACTOR = (10, 20)


def response_budget(index: int, max_response_len: int) -> tuple[int, bool]:
    """(max new tokens, is it a long one) of the sample with this index."""
    rng = random.Random(index)
    budget = rng.randint(*SHORT_TOKENS)
    long = rng.random() < LONG_FRACTION
    if long:
        budget *= rng.randint(*LONG_FACTOR)
    return min(budget, max_response_len), long


async def generate(cfg, sample, sampling_params: dict, evaluation: bool = False):
    if evaluation:
        return await default_generate(cfg, sample, sampling_params, evaluation=True)
    budget, long = response_budget(sample.index, cfg.rollout.sampling.max_response_len)
    params = {**sampling_params, "max_new_tokens": budget}
    if long:
        params["ignore_eos"] = True
    # a sample resumed after an abort (partial rollout) continues towards the same budget
    return await default_generate(cfg, sample, params)
