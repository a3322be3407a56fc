"""slime.rollout.sglang_rollout: GenerateState (tokenizer, processor, sampling params, semaphore),
`generate` (one /generate call for what is left of the response budget) and get_model_url, as
slime's custom generate functions build on them."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from typing import Any

from lean_rl.slime_compat.http_utils import post
from lean_rl.slime_compat.misc import SingletonMeta
from lean_rl.slime_compat.processing_utils import load_processor, load_tokenizer
from lean_rl.slime_compat.types import Sample

__all__ = ["GenerateState", "generate", "get_model_url"]


def get_model_url(args: Namespace, model_name: str, endpoint: str = "/generate") -> str:
    """The router's URL (lean_rl serves one policy model: every name routes to it)."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


class GenerateState(metaclass=SingletonMeta):
    """The generation state shared by every call (one per process, as in slime)."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.tokenizer = load_tokenizer(args.hf_checkpoint)
        self.processor = load_processor(args.hf_checkpoint)
        self.semaphore = asyncio.Semaphore(args.sglang_server_concurrency * max(1, args.rollout_num_engines or 1))
        self.sampling_params: dict[str, Any] = dict(
            temperature=args.rollout_temperature, top_p=args.rollout_top_p, top_k=args.rollout_top_k,
            max_new_tokens=args.rollout_max_response_len, stop=args.rollout_stop or None,
            stop_token_ids=args.rollout_stop_token_ids or None, skip_special_tokens=args.rollout_skip_special_tokens,
            no_stop_trim=True, spaces_between_special_tokens=False)
        self.reset()

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings: set = set()
        self.aborted = False


async def generate(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """One /generate call through the router continuing `sample` (its tokens, else its prompt)."""
    state = GenerateState(args)
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ValueError(f"generate: sample {sample.index} has status {sample.status}, expected PENDING or ABORTED")
    prompt_ids = list(sample.tokens) if sample.tokens else state.tokenizer.encode(sample.prompt, add_special_tokens=False)
    params = dict(sampling_params)
    params["max_new_tokens"] -= sample.response_length
    if params["max_new_tokens"] < 0:
        raise ValueError(f"generate: max_new_tokens {params['max_new_tokens']} < 0 (sample {sample.index})")
    if params["max_new_tokens"] == 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    if not sample.tokens:
        sample.tokens = prompt_ids
    output = await post(f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate",
                        {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True})
    entries = output["meta_info"].get("output_token_logprobs") or []
    sample.append_response_tokens(args, tokens=[e[1] for e in entries], log_probs=[e[0] for e in entries],
                                  trainable=True, meta_info=output["meta_info"], text=output["text"])
    return sample
