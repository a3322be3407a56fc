"""Tinker's asample on SGLang: num_samples generations of one prompt, in parallel through the router,
each with its sampled tokens' log-probs; optionally the prompt's log-probs (compute_logprobs)."""

from __future__ import annotations

import asyncio
from typing import cast

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.backends.sglang.responses import GenerateResult, ScoreResult
from lean_rl.tinker.futures import UserError
from lean_rl.tinker.wire import Sequence, encode_sample_response

_REFUSED = ("target_prompt_logprobs", "prompt_logprobs_last_n", "record_stability_info")


def prompt_tokens(prompt: dict) -> list[int]:
    tokens: list[int] = []
    for index, chunk in enumerate(prompt.get("chunks") or []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise UserError(f"prompt.chunks[{index}]: {chunk.get('type')} chunks are not supported (text tokens only)")
        tokens.extend(int(t) for t in chunk["tokens"])
    if not tokens:
        raise UserError("prompt: no tokens")
    return tokens


def sglang_params(params: dict) -> dict:
    """Tinker's SamplingParams as SGLang's sampling_params. stop: strings, token ids, or [] (no stop
    at all: EOS ignored too)."""
    out: dict = {"temperature": float(params.get("temperature", 1.0)), "top_p": float(params.get("top_p", 1.0)),
                 "top_k": int(params.get("top_k", -1))}
    if params.get("max_tokens") is not None:
        out["max_new_tokens"] = int(params["max_tokens"])
    if params.get("seed") is not None:
        out["sampling_seed"] = int(params["seed"])
    stop = params.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif isinstance(stop, list) and stop:
        key = "stop" if all(isinstance(s, str) for s in stop) else "stop_token_ids"
        out[key] = list(stop)
    elif isinstance(stop, list):
        out["ignore_eos"] = True
    return out


async def sample(client: EngineClient, request: dict) -> bytes:
    refused = [k for k in _REFUSED if request.get(k)]
    refused += [k for k in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k") if request.get(k)]
    if refused:
        raise UserError(f"asample: {', '.join(refused)} is not supported by this server")
    tokens = prompt_tokens(request.get("prompt") or {})
    params = sglang_params(request.get("sampling_params") or {})
    count = int(request.get("num_samples", 1))
    if count < 1:
        raise UserError(f"num_samples must be >= 1, got {count}")
    jobs = [client.generate(tokens, params, return_logprob=True) for _ in range(count)]
    score = client.score(tokens) if request.get("prompt_logprobs") else None
    results = await asyncio.gather(*jobs, *([score] if score is not None else []))
    generated = cast(list[GenerateResult], results[:count])
    scored = cast(ScoreResult, results[count]) if score is not None else None
    sequences = []
    for result in generated:
        if result.finish_reason == "abort":
            raise RuntimeError(f"the engine aborted the generation: {result.finish_detail}")
        sequences.append(Sequence(result.output_ids, list(result.output_log_probs or []),
                                  "length" if result.finish_reason == "length" else "stop"))
    prompt_logprobs = [float("nan"), *scored.log_probs] if scored is not None else None
    return encode_sample_response(sequences, prompt_logprobs)
