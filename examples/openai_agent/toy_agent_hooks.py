"""The lean_rl side of the example: the agent of toy_agent.py as a rollout, and its reward.

    --custom-generate-function-path toy_agent_hooks.generate
    --custom-rm-path toy_agent_hooks.model_tokens_kind_fraction
"""

from __future__ import annotations

import asyncio

import openai
from toy_agent import solve

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.openai_capture import CaptureSession
from lean_rl.testing.toy_task import kind_fraction

AGENT_TIMEOUT_S = 300.0  # one trajectory; past it the sample fails (the rollout goes on)


async def generate(cfg, sample, sampling_params):
    """Every chat completion of the agent is one engine call, recorded token-exact; the conversation
    comes back as one Sample (loss mask 1 on the model's tokens, 0 on the turns between)."""
    async with CaptureSession(cfg, sample, sampling_params) as session:
        async with openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key) as client:
            await asyncio.wait_for(solve(client, sample.prompt), AGENT_TIMEOUT_S)
    return session.samples()


async def model_tokens_kind_fraction(cfg, sample) -> float:
    """The toy task's reward over what the model wrote (loss-mask 1 tokens), not the turns between."""
    tokenizer = load_tokenizer(cfg.engines.model_path)  # cached per path
    special = set(tokenizer.all_special_ids)
    tokens = [t for t, m in zip(sample.response_tokens, sample.loss_mask) if m and t not in special]
    return kind_fraction([tokenizer.decode([t]) for t in tokens], sample.label)
