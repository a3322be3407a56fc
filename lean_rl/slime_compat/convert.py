"""Samples across the boundary: lean_rl's Sample → slime's (what a slime function sees) and back
(what the run trains on). What slime leaves implicit is made exact here or refused:

- prompt: slime's is the rendered text under --apply-chat-template; lean_rl keeps the raw value, so
  the slime sample gets the text its prompt tokens decode to, and the way back restores the raw one.
- per-token versions: slime records one version string per /generate answer; lean_rl needs one per
  response token. They are taken from the answers http_utils.post saw during this generate call,
  matched token by token; policy tokens no answer matches get the one version all answers had, and
  when answers had several versions such a sample is refused (never guessed).
- log-probs: a sample without them trains (log-prob 0, metadata["rollout_log_probs_missing"]), except
  under a correction that needs them (--use-tis, --use-rs, --decoupled-ppo, --use-rollout-logprobs):
  refused, naming the flag.
- status: ABORTED while lean_rl was not stopping the rollout is a failure (slime's examples return it
  for a failed tool or parse), not a request to resume; remove_sample is FAILED; PENDING with a
  response is COMPLETED (slime trains it).
- slime's other fields and any attribute the function set are kept in metadata["slime_attributes"]
  and set again on the next slime sample made from it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.sample import NOT_GENERATED, Sample, Status
from lean_rl.slime_compat.run_state import GenerateAnswer
from lean_rl.slime_compat.types import Sample as SlimeSample

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

ATTRIBUTES_KEY = "slime_attributes"
REWARD_DETAILS_KEY = "slime_reward_details"  # a slime reward dict's entries that are no numbers
_SLIME_FIELDS = {f.name: f for f in dataclasses.fields(SlimeSample)}
# slime's fields lean_rl's Sample has under the same name and meaning (set from it, read back from it)
_SHARED = {"group_index", "index", "prompt", "tokens", "response", "response_length", "label", "reward", "loss_mask",
           "weight_versions", "rollout_log_probs", "teacher_log_probs", "status", "metadata", "remove_sample",
           "rollout_routed_experts"}
# slime's counter objects: kept in metadata as their to_dict(), made objects again on the way in
_COUNTERS: dict[str, Any] = {"spec_info": SlimeSample.SpecInfo, "prefix_cache_info": SlimeSample.PrefixCacheInfo}


def rendered_prompt(cfg: Config, sample: Sample) -> Any:
    """The prompt as slime's data loader hands it over: the chat-rendered text under
    --apply-chat-template (what the prompt tokens decode to), else the raw value."""
    if not cfg.data.apply_chat_template or not isinstance(sample.prompt, (str, list)):
        return sample.prompt  # a scalar prompt (a task index) is handed over as it is
    tokenizer = load_tokenizer(cfg.engines.model_path)
    return tokenizer.decode(sample.tokens[:sample.prompt_length], skip_special_tokens=False)


def keep_reward_details(cfg: Config, metadata: dict, value: Any) -> Any:
    """A slime reward dict may hold entries that are no numbers (retool's answer text "pred"): slime
    trains only the --reward-key entry. lean_rl keeps the numbers (and the trained entry, whatever it
    holds: the run's check names it) as the reward, the rest in metadata, and to_slime hands the whole
    dict back to slime's functions."""
    if not isinstance(value, dict):
        return value
    trained = {cfg.reward.reward_key, cfg.eval.reward_key}
    details = {k: v for k, v in value.items() if k not in trained and not _is_number(v)}
    if details:
        metadata[REWARD_DETAILS_KEY] = details
    return {k: v for k, v in value.items() if k not in details}


def _is_number(value: Any) -> bool:
    if value is None or isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def to_slime(cfg: Config, sample: Sample) -> SlimeSample:
    n = sample.response_length
    rewards = sample.metadata.get("rewards")
    if isinstance(rewards, dict):
        rewards = {**rewards, **dict(sample.metadata.get(REWARD_DETAILS_KEY) or {})}
    out = SlimeSample(
        group_index=sample.group_index, index=sample.index, prompt=rendered_prompt(cfg, sample),
        tokens=list(sample.tokens), response=sample.response, response_length=n, label=sample.label,
        reward=rewards if isinstance(rewards, dict) and cfg.reward.reward_key else sample.reward,
        loss_mask=list(sample.loss_mask) if n else None, rollout_log_probs=list(sample.rollout_log_probs) if n else None,
        weight_versions=[str(v) for v in dict.fromkeys(sample.weight_versions) if v != NOT_GENERATED],
        teacher_log_probs=list(sample.teacher_log_probs) or None, status=SlimeSample.Status(sample.status.value),
        metadata=sample.metadata)
    for name, value in dict(sample.metadata.get(ATTRIBUTES_KEY) or {}).items():
        setattr(out, name, _COUNTERS[name].from_dict(value) if name in _COUNTERS and isinstance(value, dict) else value)
    return out


def from_slime(cfg: Config, slime: SlimeSample, original: Sample, answers: list[GenerateAnswer],
               stopping: bool, flag: str) -> Sample:
    """The lean_rl Sample of what a slime generate function returned for `original` (left unchanged).
    ValueError, naming `flag`, when it cannot be trained on as it is."""
    where = f"{flag}: sample {slime.index}"
    tokens, n = [int(t) for t in slime.tokens], int(slime.response_length)
    if not 0 <= n <= len(tokens):
        raise ValueError(f"{where}: response_length {n} but {len(tokens)} tokens")
    loss_mask = [int(m) for m in slime.loss_mask] if slime.loss_mask is not None else [1] * n
    if len(loss_mask) != n:
        raise ValueError(f"{where}: loss_mask has {len(loss_mask)} entries for response_length {n}")
    log_probs = slime.rollout_log_probs
    metadata = slime.metadata if isinstance(slime.metadata, dict) else {}
    if log_probs is None:
        if n and cfg.algorithm.needs_rollout_log_probs:
            raise ValueError(f"{where}: no rollout_log_probs, which {_log_prob_flag(cfg)} needs (send "
                             "return_logprob in the /generate payload and pass log_probs to append_response_tokens)")
        log_probs = [0.0] * n
        metadata["rollout_log_probs_missing"] = True if n else metadata.get("rollout_log_probs_missing", False)
    elif len(log_probs) != n:
        raise ValueError(f"{where}: rollout_log_probs has {len(log_probs)} entries for response_length {n}")
    prompt_length = len(tokens) - n
    kept: list[int] = []
    if (original.response_length and prompt_length == original.prompt_length
            and tokens[:len(original.tokens)] == original.tokens):
        kept = list(original.weight_versions)  # a resumed response: what was generated before keeps its versions
    versions = response_versions(tokens[prompt_length:], loss_mask, answers, kept, where)
    status, error = _status(slime, n, stopping)
    if error:
        metadata["generate_error"] = error
    attributes = {k: _as_json(v) for k, v in vars(slime).items()
                  if k not in _SHARED and (k not in _SLIME_FIELDS or not _is_default(k, v))}
    if attributes:
        metadata[ATTRIBUTES_KEY] = attributes
    prompt = original.prompt if slime.prompt == rendered_prompt(cfg, original) else slime.prompt
    teacher = list(slime.teacher_log_probs or [])
    outside_index = (original.metadata.get(ATTRIBUTES_KEY) or {}).get("index")  # outside_samples.py's
    if outside_index is not None:
        metadata.setdefault(ATTRIBUTES_KEY, {})["index"] = outside_index
    index = original.index if slime.index is None or slime.index == outside_index else int(slime.index)
    group_index = original.group_index if slime.group_index is None else int(slime.group_index)
    # a dict reward stays a dict until --reward-key picks its value (rollout/rewards.py), as lean_rl's own do
    out = Sample(index=index, group_index=group_index, prompt=prompt, tokens=tokens,
                 response=slime.response or "", response_length=n, label=slime.label,
                 reward=keep_reward_details(cfg, metadata, slime.reward),  # type: ignore[arg-type]
                 loss_mask=loss_mask, rollout_log_probs=[float(x) for x in log_probs], weight_versions=versions,
                 status=status, metadata=metadata, teacher_log_probs=teacher if len(teacher) == n else [])
    out.check()
    return out


def response_versions(response: list[int], loss_mask: list[int], answers: list[GenerateAnswer], kept: list[int],
                      where: str) -> list[int]:
    """The policy version of each response token: the answers' versions where their tokens appear in
    order, NOT_GENERATED for tool tokens; ValueError when a policy token's version is not known."""
    versions = list(kept) + [NOT_GENERATED] * (len(response) - len(kept))
    position = len(kept)
    for answer in answers:
        ids = answer.output_ids
        start = _find(response, ids, position, loss_mask) if ids else None
        if start is not None and answer.relayed and any(
                a.output_ids == ids and a.versions != answer.versions for a in answers):
            # the gateway relays every call's answers: two with these ids from different policy versions
            raise ValueError(f"{where}: {len(ids)} tokens match answers of policy versions "
                             f"{sorted({v for a in answers if a.output_ids == ids for v in a.versions})} relayed "
                             "by the router gateway (other calls' too): which one made them is unknown")
        if start is not None:
            versions[start:start + len(ids)] = answer.versions
            position = start + len(ids)
    unknown = [i for i in range(len(kept), len(response)) if loss_mask[i] and versions[i] == NOT_GENERATED]
    if unknown:
        seen = sorted({v for a in answers for v in a.versions})
        if len(seen) == 1:  # every answer came from one policy version: so did these tokens
            for i in unknown:
                versions[i] = seen[0]
        elif not seen:
            raise ValueError(f"{where}: {len(unknown)} trainable tokens but no /generate answer was seen, so their "
                             "policy version is unknown (send requests with slime.utils.http_utils.post)")
        else:
            raise ValueError(f"{where}: {len(unknown)} trainable tokens match no /generate answer's output, and the "
                             f"answers came from policy versions {seen}: which one made them is unknown")
    return versions


def _find(haystack: list[int], needle: list[int], start: int, mask: list[int]) -> int | None:
    """Where `needle` (an answer's ids) first appears from `start` on trainable tokens only: a tool's
    text may hold the same ids (a one-token answer "e" inside an observation), and is not the answer."""
    last = len(haystack) - len(needle)
    first = needle[0]
    for i in range(start, last + 1):
        if haystack[i] == first and haystack[i:i + len(needle)] == needle and all(mask[i:i + len(needle)]):
            return i
    return None


def _status(slime: SlimeSample, n: int, stopping: bool) -> tuple[Status, str | None]:
    value = getattr(slime.status, "value", slime.status)
    if slime.remove_sample:
        return Status.FAILED, "remove_sample was set by the generate function"
    if value == "aborted":
        if stopping:
            return Status.ABORTED, None  # lean_rl aborted it (surplus, weight update): resumed or regenerated
        return Status.FAILED, ("the generate function returned ABORTED while the rollout was not aborting it: "
                               "taken as a failure (slime's examples mean it so), not resumed")
    if value == "pending":
        return (Status.COMPLETED, None) if n else (Status.FAILED, "the generate function returned no response")
    return Status(value), None


def _as_json(value: Any) -> Any:
    """slime's counter objects as their to_dict() (the sample dumps hold metadata as JSON)."""
    if isinstance(value, (SlimeSample.SpecInfo, SlimeSample.PrefixCacheInfo)):
        return value.to_dict()
    return value


def _is_default(name: str, value) -> bool:
    f = _SLIME_FIELDS[name]
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return value == default


def _log_prob_flag(cfg: Config) -> str:
    algo = cfg.algorithm
    names = [flag for flag, on in (("--use-tis", algo.use_tis), ("--use-rs", getattr(algo, "use_rs", False)),
                                   ("--decoupled-ppo", algo.decoupled_ppo),
                                   ("--use-rollout-logprobs", algo.use_rollout_logprobs)) if on]
    return " and ".join(names) or "the run"
