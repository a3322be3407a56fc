"""The default per-sample generate and the /generate primitive every generate function builds on:
retries through the router, routing replay's direct engine calls, per-token policy versions.

    generate(cfg, sample, sampling_params, evaluation=False) -> Sample    (--custom-generate-function-path's default)
    generate_with_retries(cfg, input_ids, sampling_params, rid, ...) -> GenerateResult
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import (parse_weight_version, policy_client, retry_engine_call, router_client,
                                  serving_engine_urls)
from lean_rl.rollout.vision import EnginePrompt, engine_prompt
from lean_rl.sample import Sample, Status
from lean_rl.utils.token_text import decode_ids

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.backends.sglang.responses import GenerateResult
    from lean_rl.config import Config


FINISH_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


async def generate(cfg: Config, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """Default per-sample generate: one /generate call for what is left of the response budget.
    A sample that already holds partial tokens (an earlier abort) continues from them. Evaluation
    generates the same way (its sampling_params come from cfg.eval.sampling)."""
    if not sample.tokens:  # a scalar prompt (e.g. a task index) has no text to generate from
        raise ValueError(f"sample {sample.index}: prompt {sample.prompt!r} is not text, so the default generate "
                         "has no tokens to start from; a --custom-generate-function-path reads sample.prompt")
    budget = sampling_params["max_new_tokens"] - sample.response_length
    if budget <= 0:
        sample.status = Status.TRUNCATED
        return sample
    result = await generate_with_retries(cfg, engine_prompt(cfg.engines.model_path, sample),
                                         {**sampling_params, "max_new_tokens": budget},
                                         rid=f"lean_rl-{sample.index}-{sample.response_length}",
                                         on_retry=lambda err: count_retry(sample, err),
                                         # replay's direct engine calls: a prompt's samples share an engine
                                         routing_key=(f"lean_rl-group-{sample.group_index}"
                                                      if cfg.engines.return_routed_experts else None))
    first_call = sample.response_length == 0
    sample.append_response(result.output_ids, log_probs=result.output_log_probs,
                           weight_versions=token_versions(result), routed_experts=result.routed_experts)
    if first_call and result.text is not None and engine_text_is_decode(sampling_params):
        sample.response = result.text  # the engine decoded these very ids already
    else:  # a continuation: decoded whole, so that a character split between the calls comes out right
        sample.response = decode_ids(load_tokenizer(cfg.engines.model_path), sample.response_tokens)
    sample.status = FINISH_TO_STATUS[result.finish_reason]
    return sample


async def generate_with_retries(cfg: Config, input_ids: list[int] | EnginePrompt, sampling_params: dict, rid: str,
                                on_retry=None, routing_key: str | None = None,
                                engine: EngineClient | None = None) -> GenerateResult:
    """/generate through the router, retried when an engine dies under the request (the router answers
    5xx or drops the connection; the engine monitor restarts the engine meanwhile and the router sends
    the retry elsewhere). A failed request returned no tokens, so a retry duplicates nothing.
    `engine`: the first attempt goes to that engine directly (a session's own), retries to the router.
    Under --use-rollout-routing-replay every request asks for the experts of all its tokens, and goes to
    an engine directly (routes_engine). An image prompt comes as an EnginePrompt (rollout/vision.py)."""
    prompt = input_ids if isinstance(input_ids, EnginePrompt) else EnginePrompt(input_ids)

    async def attempt(number: int) -> GenerateResult:
        if engine is not None and number == 0:
            client = engine
        elif cfg.engines.return_routed_experts:
            client = await routes_engine(cfg, routing_key or rid, number)
        else:
            client = router_client(cfg)
        return await client.generate(prompt.input_ids, sampling_params, return_logprob=True, rid=rid,
                                     routing_key=routing_key, return_routed_experts=cfg.engines.return_routed_experts,
                                     image_data=prompt.image_data, image_token_id=prompt.image_token_id)

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
    return policy_client(cfg, url)


def engine_text_is_decode(sampling_params: dict) -> bool:
    """SGLang's `text` of a request made with these parameters is tokenizer.decode of its output_ids:
    special tokens kept and a matched stop token not trimmed, as SamplingConfig.to_sglang asks (SGLang's
    defaults skip the one and trim the other), and no stop strings (SGLang's text ends where one ends,
    even inside a token: " as" of the token " assistant" for the stop "as", no_stop_trim or not).
    tests/integration/test_rollout.py compares the two."""
    return (sampling_params.get("skip_special_tokens") is False and sampling_params.get("no_stop_trim") is True
            and not sampling_params.get("stop"))


def count_retry(sample: Sample, err: Exception) -> None:
    sample.metadata["generate_retries"] = sample.metadata.get("generate_retries", 0) + 1
    sample.metadata["last_generate_error"] = str(err)[:500]


def token_versions(result) -> list[int]:
    """Per output token, the policy version that generated it (SGLang reports spans when weights changed
    during the request; otherwise one version for all)."""
    count = len(result.output_ids)
    versions = [parse_weight_version(result.weight_version)] * count
    for span in result.weight_version_spans:  # one slice per span: SGLang sends a span on every answer
        start, end = max(span.start, 0), min(span.end, count)
        if start < end:
            versions[start:end] = [parse_weight_version(span.version)] * (end - start)
    return versions
