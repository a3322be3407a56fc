"""slime.rollout.rm_hub: the rule-based rewards slime's --rm-type names, and async_rm /
batched_async_rm as slime's functions call them.

  deepscaler  the boxed answer after </think> (or ###Response) equals the label: 1, else 0
  dapo        DAPO's {"score": ±1, "acc", "pred"} (the answer after "Answer:")
  math        the boxed answer equals the label (math-verify): 1, else 0
  f1          token F1 against the label
  gpqa        the chosen letter (A-D, or metadata["valid_letters"]) equals the label's
  random      0 or 1 at random
  boxed_<t>   <t> scored on the boxed answer only
  remote_rm   POST {prompt, response, label} to args.rm_url
ifbench needs its instruction checkers (not shipped with lean_rl): refused with a clear error."""

from __future__ import annotations

import asyncio
import random
import re
import types

import httpx

from lean_rl.rollout import rewards
from lean_rl.slime_compat.misc import load_function
from lean_rl.slime_compat.rm_hub.f1 import f1_score
from lean_rl.slime_compat.rm_hub.math_dapo_utils import compute_score as compute_score_dapo
from lean_rl.slime_compat.rm_hub.math_utils import extract_answer, grade, grade_answer_verl
from lean_rl.slime_compat.run_state import bound_config
from lean_rl.slime_compat.types import Sample

__all__ = ["async_rm", "batched_async_rm", "grade_answer_verl", "extract_answer", "remote_rm",
           "get_deepscaler_rule_based_reward"]


def get_deepscaler_rule_based_reward(response: str, label) -> int:
    """deepscaler's score, synchronous and graded in this thread, as slime's function of this name is
    called outside a run (rollout_buffer's generator processes): no run, so no reward worker."""
    solution = _deepscaler_solution(response)
    answer = extract_answer(solution) if solution is not None else None
    if answer is None or label in ("", None):
        return 0
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth) or ""
    return int(bool(truth) and grade(answer, truth))


def _deepscaler_solution(response: str) -> str | None:
    if "</think>" in response:
        return response.split("</think>")[-1]
    if "###Response" in response:
        return response.split("###Response")[1]
    return None


async def _math_equal(answer: str, label) -> bool:
    """math-verify in lean_rl's reward worker process (bounded by --rm-timeout)."""
    scored = types.SimpleNamespace(response=f"\\boxed{{{answer}}}", label=str(label))
    # math_reward reads only .response and .label of the sample
    return await rewards.math_reward(bound_config(), scored) == 1.0  # type: ignore[arg-type]


async def deepscaler(response: str, label) -> int:
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0
    answer = extract_answer(solution)
    if answer is None or label in ("", None):
        return 0
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth) or ""
    return int(bool(truth) and await _math_equal(answer, truth))


def gpqa(response: str, label, metadata: dict | None = None) -> float:
    letters = [str(x).upper() for x in (metadata or {}).get("valid_letters") or "ABCD"]
    text = response.split("</think>")[-1]
    found = re.findall(r"\b(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Z])\)?", text, flags=re.IGNORECASE)
    found = [x.upper() for x in found if x.upper() in letters] or \
        [x for x in re.findall(r"\b([A-Z])\b", text) if x in letters]
    return float(bool(found) and found[-1] == str(label).strip().upper())


async def remote_rm(args, sample: Sample, max_retries: int = 10):
    last: Exception | None = None
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        for attempt in range(max_retries):
            try:
                answer = await client.post(args.rm_url, json={"prompt": sample.prompt, "response": sample.response,
                                                              "label": sample.label})
                answer.raise_for_status()
                return answer.json()
            except (httpx.TransportError, httpx.HTTPStatusError) as err:
                last = err
                await asyncio.sleep(min(2**attempt, 30) + random.random())
    raise RuntimeError(f"remote_rm {args.rm_url}: no answer after {max_retries} tries ({last})")


async def async_rm(args, sample: Sample, **kwargs):
    """The reward of one sample: the sample's or the run's custom reward function, else --rm-type
    (metadata["rm_type"] first, as slime reads it)."""
    path = getattr(sample, "custom_rm_path", None) or getattr(args, "custom_rm_path", None)
    if path:
        return await load_function(path)(args, sample, **kwargs)
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = (metadata.get("rm_type") or getattr(args, "rm_type", None) or "").strip()
    response, label = sample.response, sample.label
    if rm_type.startswith("boxed_"):
        response, rm_type = extract_answer(response) or "", rm_type[len("boxed_"):]
    if rm_type == "remote_rm":
        return await remote_rm(args, sample)
    if rm_type == "deepscaler":
        return await deepscaler(response, label)
    if rm_type == "dapo":
        return compute_score_dapo(response, label)
    if rm_type == "math":
        answer = extract_answer(response) if "\\boxed" in response else response
        return int(answer is not None and await _math_equal(answer, label))
    if rm_type == "f1":
        return f1_score(response, label)[0]
    if rm_type == "gpqa":
        return gpqa(response, label, metadata)
    if rm_type == "random":
        return random.randint(0, 1)
    if rm_type == "ifbench":
        raise NotImplementedError("--rm-type ifbench needs IFBench's instruction checkers, which lean_rl does not "
                                  "ship: score with --custom-rm-path")
    raise NotImplementedError(f"rule-based reward {rm_type!r} is not implemented" if rm_type
                              else "no reward type: set --rm-type or --custom-rm-path")


async def batched_async_rm(args, samples: list[Sample], **kwargs) -> list:
    """Every sample's reward: the custom reward function once over the list, else async_rm each."""
    if getattr(args, "custom_rm_path", None):
        return await load_function(args.custom_rm_path)(args, samples, **kwargs)
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))
