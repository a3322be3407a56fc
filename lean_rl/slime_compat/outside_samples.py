"""Finished slime Samples that a rollout function built itself, outside any group the data source
handed out (slime_plugins/rollout_buffer: `Sample(index=instance_id, tokens=..., loss_mask=...,
reward=...)` from conversations its generator wrote, no group_index), handed to
`data_buffer.add_samples` and taken back with `get_samples`.

Each becomes a lean_rl Sample held by the buffer (DataBuffer.hold_finished_groups: the buffer's own
group and sample indices; slime's `index` is handed back as it was). The policy version of each
trainable token comes from what lean_rl saw generate it: /generate answers of the call whose ids
appear among the sample's trainable tokens (convert.response_versions), else the router gateway's
record of the chat / completion answers it relayed whose text the decoded trainable span holds
(router_gateway.relayed_text_versions: a conversation re-tokenized from its text keeps no ids). A
span no relayed answer accounts for, or one written by several policy versions, is refused."""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.sample import Sample
from lean_rl.slime_compat.convert import ATTRIBUTES_KEY, from_slime
from lean_rl.slime_compat.router_gateway import relayed_text_versions
from lean_rl.slime_compat.run_state import GenerateAnswer
from lean_rl.slime_compat.types import Sample as SlimeSample

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

logger = logging.getLogger(__name__)


def is_outside_group(group: list[SlimeSample]) -> bool:
    """A group none of whose samples came from the data source (slime's own leave group_index None)."""
    return bool(group) and all(isinstance(s, SlimeSample) and s.group_index is None for s in group)


def outside_group(cfg: Config, group: list[SlimeSample], answers: list[GenerateAnswer], flag: str) -> list[Sample]:
    return [_outside_sample(cfg, s, answers, flag) for s in group]


def _outside_sample(cfg: Config, slime: SlimeSample, answers: list[GenerateAnswer], flag: str) -> Sample:
    tokens, n = [int(t) for t in slime.tokens], int(slime.response_length or 0)
    if not 0 < n <= len(tokens):
        raise ValueError(f"{flag}: sample {slime.index} handed to add_samples has response_length {n} and "
                         f"{len(tokens)} tokens: a finished sample needs its prompt and response tokens")
    view = copy.copy(slime)
    view.index = view.group_index = None  # the buffer numbers it; slime's index is handed back as it was
    view.metadata = dict(slime.metadata) if isinstance(slime.metadata, dict) else {}
    prompt_length = len(tokens) - n
    # the sample's own record: an empty response on its prompt (nothing to keep from an earlier try)
    original = Sample(index=0, group_index=0, prompt=slime.prompt, tokens=tokens[:prompt_length])
    mask = [int(m) for m in slime.loss_mask] if slime.loss_mask is not None else [1] * n
    seen = answers + _text_answers(cfg, tokens[prompt_length:], mask)
    try:
        out = from_slime(cfg, view, original, seen, False, flag)
    except ValueError as err:
        if "policy version" not in str(err):
            raise
        latest = relayed_text_versions.latest()
        raise ValueError(f"{err}; built outside lean_rl, its trainable text must hold an answer the router gateway "
                         f"relayed (args.sglang_router_ip/port): {len(relayed_text_versions)} kept, the latest "
                         f"{latest!r:.120}") from None
    out.metadata.setdefault(ATTRIBUTES_KEY, {})["index"] = slime.index
    return out


def _text_answers(cfg: Config, response: list[int], mask: list[int]) -> list[GenerateAnswer]:
    """For each trainable span whose text holds a relayed answer of one policy version: that span as an
    answer of that version (the matching in convert.py then places it exactly)."""
    if len(mask) != len(response):
        return []  # from_slime names the mismatch
    tokenizer = load_tokenizer(cfg.engines.model_path)
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            span = response[start:i]
            text = tokenizer.decode(span, skip_special_tokens=True)
            versions = relayed_text_versions.versions_within(text)
            if versions is not None and len(versions) == 1:
                out.append(GenerateAnswer(span, [next(iter(versions))] * len(span), False, relayed=True))
            else:
                logger.warning("a trainable span of %d tokens matches %s relayed answer texts (%d kept; latest %r): %r",
                               len(span), "several versions' " if versions else "no", len(relayed_text_versions),
                               relayed_text_versions.latest(), text[:300])
            start = None
    return out
