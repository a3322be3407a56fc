"""A search agent written for slime (its API as slime's docs and search-r1 example use it), run by
lean_rl with this file unchanged: tests/e2e/test_slime_compat_run.py. Nothing here imports lean_rl.

Each turn sends the text so far to the router's /generate, appends the answer's tokens with their
log-probs; then a "search" (a local lookup standing in for a retrieval server) whose result is
appended as tool tokens (not trained on). The reward is a dict (the toy task's score: the fraction of
the model's tokens of the kind the prompt asks for, and the number of turns). The loss is a custom
PPO loss in slime's contract (--loss-type custom_loss)."""

import asyncio
import re

import torch

from slime.backends.megatron_utils.loss import get_log_probs_and_entropy
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.ppo_utils import compute_policy_loss
from slime.utils.types import Sample

SEARCH_CONFIG = {"max_turns": 2, "tokens_per_turn": 6, "search_concurrency": 8}
SEMAPHORE = asyncio.Semaphore(SEARCH_CONFIG["search_concurrency"])
KINDS = {"digits": re.compile(r"\s*\d+\s*"), "letters": re.compile(r"\s?[a-z]")}


async def search(query: str) -> str:
    """The retrieval backend: here a deterministic local lookup."""
    async with SEMAPHORE:
        await asyncio.sleep(0)
        return "digits 0 1 2" if "digit" in query else "letters a b c"


async def generate(args, sample: Sample, sampling_params) -> Sample:
    assert not args.partial_rollout, "partial rollout is not supported by this function"
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_text = sample.prompt
    prompt_ids = state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    sample.tokens = list(prompt_ids)
    sample.loss_mask = []
    sample.rollout_log_probs = []
    response = ""
    params = {**sampling_params, "max_new_tokens": SEARCH_CONFIG["tokens_per_turn"]}
    for turn in range(SEARCH_CONFIG["max_turns"]):
        output = await post(url, {"text": prompt_text + response, "sampling_params": params, "return_logprob": True})
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        entries = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[e[1] for e in entries], log_probs=[e[0] for e in entries],
                                      trainable=True, meta_info=output["meta_info"])
        response += output["text"]
        if turn == SEARCH_CONFIG["max_turns"] - 1:
            break
        observation = f"\n<information>{await search(prompt_text)}</information>\n"
        obs_ids = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False)
        response += observation
    sample.response = response
    sample.turns = SEARCH_CONFIG["max_turns"]  # an attribute of the agent's own
    return sample


async def reward(args, sample: Sample, **kwargs):
    """{"score": fraction of the model's tokens of the asked kind, "turns": turns taken}."""
    state = GenerateState(args)
    response_ids = sample.tokens[len(sample.tokens) - sample.response_length:]
    mine = [t for t, m in zip(response_ids, sample.loss_mask) if m and t not in state.tokenizer.all_special_ids]
    texts = [state.tokenizer.decode([t]) for t in mine]
    score = sum(bool(KINDS[sample.label].fullmatch(t)) for t in texts) / len(texts) if texts else 0.0
    return {"score": score, "turns": float(getattr(sample, "turns", 0))}


def reward_post_process(args, samples: list[Sample]):
    """GRPO's group normalisation by hand, as slime's reward post-process hooks do: (raw, rewards)."""
    raw = [s.get_reward_value(args) for s in samples]
    rewards = []
    for start in range(0, len(samples), args.n_samples_per_prompt):
        group = raw[start:start + args.n_samples_per_prompt]
        mean = sum(group) / len(group)
        rewards += [r - mean for r in group]
    return raw, rewards


def ppo_loss(args, batch, logits, sum_of_sample_mean):
    """PPO's clipped policy loss, as a slime custom loss computes it, plus its own metric."""
    out = get_log_probs_and_entropy(logits, args=args, unconcat_tokens=batch["unconcat_tokens"],
                                    total_lengths=batch["total_lengths"], response_lengths=batch["response_lengths"])
    log_probs = torch.cat(out["log_probs"])
    ppo_kl = torch.cat(batch["log_probs"]) - log_probs
    pg_loss, clipfrac = compute_policy_loss(ppo_kl, torch.cat(batch["advantages"]), args.eps_clip, args.eps_clip_high)
    loss = sum_of_sample_mean(pg_loss)
    return loss, {"pg_loss": loss.detach(), "pg_clipfrac": sum_of_sample_mean(clipfrac),
                  "search_agent_loss_calls": torch.tensor(1.0)}
