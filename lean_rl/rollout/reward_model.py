"""A reward model served by the run (--rm-hf-checkpoint): SGLang servers of their own, started beside
the policy's as the distillation teacher's are (engine_start.py), never given weight updates.

Each server runs with --is-embedding, so its /classify answers the score head's outputs for a
sequence (`embedding`: one float per label; label 0 is the reward). sglang-router does not forward
/classify, so requests go to the servers in turn. The sample is sent as token ids when the reward
model's tokenizer is the policy's (the exact sequence generated), else as text (prompt + response),
which the reward model's own tokenizer reads. The servers are watched like the policy's (an
EngineMonitor per group, engine_start.py: a dead or hung one leaves the router and is restarted) and
each request goes to one the router lists as healthy. A reward model that cannot answer (after
--rollout-request-retries) is a fault: RewardModelError, which rewards.score_group turns into a FAILED
sample (metadata["reward_error"], rollout/reward_failed); it never becomes a reward.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client_errors import EngineError
from lean_rl.rollout.base import engine_client, healthy_workers, retry_engine_call
from lean_rl.sample import Sample

if TYPE_CHECKING:
    from pathlib import Path

    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.config import Config

_turns = itertools.count()  # which server answers next (round robin)


def reward_model_engine_group(cfg: Config, output_dir: Path) -> EngineGroup | None:
    """The reward model's engine group when this run serves one, not yet started."""
    from lean_rl.backends.sglang.engines import EngineGroup

    engines = cfg.reward_serving.rm_engines
    return None if engines is None else EngineGroup(engines, output_dir / "reward_model_engines",
                                                    name="reward_model_engines")


@functools.lru_cache(maxsize=4)
def _same_tokenizer(policy_dir: str, rm_dir: str) -> bool:
    from lean_rl.buffer.prompt_source import load_tokenizer

    return bool(load_tokenizer(policy_dir).get_vocab() == load_tokenizer(rm_dir).get_vocab())


def classify_body(sample: Sample, same_tokenizer: bool) -> dict:
    """/classify's request for the sample's prompt + response: its token ids, or its text."""
    if sample.multimodal_inputs is not None:  # the ids hold image pads the reward model would read as text
        raise ValueError("the reward model (--rm-hf-checkpoint) reads token ids or text, not images: image samples "
                         "(--multimodal-keys) need a rule reward (--rm-type / --custom-rm-path) for now (docs/vlm.md)")
    if same_tokenizer:
        return {"input_ids": list(sample.tokens)}
    if not isinstance(sample.prompt, str):
        raise ValueError("the reward model's tokenizer is not the policy's, so it reads text, and this sample's "
                         f"prompt is a {type(sample.prompt).__name__}, not a string: render it (--apply-chat-template)")
    return {"text": sample.prompt + sample.response}


def read_score(payload: object) -> float:
    """Label 0's output of a /classify answer; ValueError for anything else."""
    embedding = payload.get("embedding") if isinstance(payload, dict) else None
    if not isinstance(embedding, list) or not embedding or not isinstance(embedding[0], (int, float)):
        raise ValueError(f"/classify answered no score: {str(payload)[:200]}")
    score = float(embedding[0])
    if not math.isfinite(score):
        raise ValueError(f"/classify answered a score of {score}")
    return score


class RewardModelError(RuntimeError):
    """The served reward model gave no score for a sample (every server unreachable, hung or failing,
    past --rollout-request-retries): the sample fails (rewards.score_group), it is never a reward."""


async def reward_model_score(cfg: Config, sample: Sample) -> float:
    """The reward model's score of the sample's prompt + response, retried like generation. Each try
    goes to a server the reward model's router lists as healthy (its engine monitor, engine_start.py,
    takes a dead or hung server out and restarts it), to any server when the router cannot say.
    RewardModelError, naming the servers and the last error, when no try answered."""
    engines = cfg.reward_serving.rm_engines
    if engines is None:
        raise RuntimeError("reward_model_score needs --rm-hf-checkpoint (this run serves no reward model)")
    same = _same_tokenizer(cfg.engines.model_path, engines.model_path)
    body = classify_body(sample, same)

    async def attempt(number: int) -> float:
        router = engine_client(engines.router_url, engines.request_timeout_s, engines.api_key)
        urls = await healthy_workers(router) or engines.engine_urls
        url = urls[next(_turns) % len(urls)]  # another server on each try
        client = engine_client(url, engines.request_timeout_s, engines.api_key)
        response = await client.request("POST", "/classify", body)
        try:
            return read_score(response.json())
        except ValueError as err:
            raise EngineError(url, "/classify", str(err)) from None

    try:
        return await retry_engine_call(cfg, attempt)
    except EngineError as err:
        raise RewardModelError(f"the reward model (--rm-hf-checkpoint {engines.model_path}, servers "
                               f"{', '.join(engines.engine_urls)}) gave no score in {cfg.rollout.request_retries + 1} "
                               f"tries (--rollout-request-retries): {err}") from None


async def reward_model_reward(cfg: Config, sample: Sample) -> float:
    """The reward function of a run whose reward is the served reward model's score."""
    return await reward_model_score(cfg, sample)
