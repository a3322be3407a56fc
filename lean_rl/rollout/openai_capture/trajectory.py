"""Recorded calls -> training Samples (pure logic, no I/O): the calls of a session form a tree, each
tree path a Sample.

The tree: each call is a node; its parent is the earlier call whose prompt + output ids are the
longest exact token prefix of this call's prompt ids (none: the call is a root). One agent's turns
form a chain; a planner and the solvers it calls (their prompts are not prefixes of one another), an
agent that trims or edits its history, or two calls from one context form several roots or branches.
Nothing is re-tokenized or patched to make a call fit.

Tree -> samples (one Sample per maximal token-exact path, i.e. per leaf): a call that is its parent's
first child continues the parent's Sample: the rest of its prompt (tool results, the next user turn,
the template's glue) goes in with loss mask 0, its output with loss mask 1, the engine's log-probs
and weight versions. A root, or a later child of a parent, starts a new Sample whose prompt is the
call's whole prompt (the shared ancestors' outputs are context there, so each sampled token is
trained exactly once). Every Sample gets the trajectory's reward and loss_weight 1/n (n = the number
of Samples of the trajectory), so a trajectory that fanned out into 8 Samples weighs what one does in
the loss aggregation (algorithms/losses.aggregation_weights). metadata["capture_calls"] lists each
Sample's calls with their node and parent numbers (the call order of the session).

Fan-out indices: the first Sample of a trajectory keeps the index the buffer gave; part k >= 1 gets
`fanout_index(index, k)` = k * 2**40 + index, with metadata["parent_index"] = index and
metadata["trajectory_part"] = k. The buffer counts indices up from 0 and never reaches 2**40, so
they cannot collide with one it hands out, nor with another trajectory's parts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lean_rl.rollout.generate import FINISH_TO_STATUS
from lean_rl.sample import Sample, Status

FANOUT_STRIDE = 2**40


def fanout_index(parent_index: int, part: int) -> int:
    if part < 1:
        raise ValueError(f"fan-out part must be >= 1, got {part}")
    if not 0 <= parent_index < FANOUT_STRIDE:
        raise ValueError(f"sample index {parent_index} is outside [0, 2**40): no collision-free fan-out index")
    return part * FANOUT_STRIDE + parent_index


@dataclass
class CallRecord:
    """One chat completion, token-exact: the ids the engine was given and the ids it sampled."""

    prompt_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    weight_versions: list[int]  # per output token
    finish_reason: str  # the engine's: "stop", "length" or "abort"
    info: dict[str, Any] = field(default_factory=dict)  # what the call recorded besides tokens
    routed_experts: str | None = None  # --use-rollout-routing-replay: the engine's, for prompt + output

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.output_log_probs) != n or len(self.weight_versions) != n:
            raise ValueError(f"call: {n} output ids but {len(self.output_log_probs)} log-probs and "
                             f"{len(self.weight_versions)} versions")
        if self.finish_reason not in FINISH_TO_STATUS:
            raise ValueError(f"call: unknown finish reason {self.finish_reason!r}")
        if not self.prompt_ids:
            raise ValueError("call: empty prompt")


def splice_prompt_ids(text: str, tips: list[tuple[str, list[int]]], encode: Callable[[str], list[int]]) -> list[int]:
    """The prompt ids of rendered `text`: when it starts with the text of an earlier call's prompt +
    output (`tips`: (text, ids) pairs; the longest match), those very ids followed by the rest encoded,
    so the model's sampled ids are never re-tokenized; else the whole text encoded."""
    best: tuple[str, list[int]] | None = None
    for tip_text, tip_ids in tips:
        if text.startswith(tip_text) and (best is None or len(tip_text) > len(best[0])):
            best = (tip_text, tip_ids)
    if best is None:
        return encode(text)
    rest = text[len(best[0]):]
    return list(best[1]) + (encode(rest) if rest else [])


class TrajectoryAssembler:
    """Adds calls in the order they finished; `samples()` is the result. The first Sample is `base`
    itself (its tokens replaced by the first call's prompt), so it keeps its identity in the group."""

    def __init__(self, base: Sample):
        self.base = base
        self._samples: list[Sample] = []
        self._last_call: list[CallRecord] = []  # per sample
        self._truncated: set[int] = set()  # samples whose response budget ran out before a call
        self._tips: list[list[int]] = []  # per node: its prompt + output ids
        self._parents: list[int | None] = []  # per node
        self._node_sample: list[int] = []  # per node: the sample it trains in
        self._has_child: set[int] = set()

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def parents(self) -> list[int | None]:
        """The tree: per call (in the order added), its parent call, None for a root."""
        return list(self._parents)

    def parent_node(self, prompt_ids: list[int]) -> int | None:
        """The call whose prompt + output ids are the longest exact prefix of `prompt_ids` (None: a root)."""
        best, best_len = None, -1
        for node, tip in enumerate(self._tips):
            n = len(tip)
            if best_len < n <= len(prompt_ids) and prompt_ids[:n] == tip:
                best, best_len = node, n
        return best

    def parent(self, prompt_ids: list[int]) -> int | None:
        """The sample a call with these prompt ids continues: its parent call's, when that call has no
        child yet (None: the call starts a new sample)."""
        node = self.parent_node(prompt_ids)
        return None if node is None or node in self._has_child else self._node_sample[node]

    def response_length_after_prompt(self, prompt_ids: list[int]) -> int:
        """How long the response of the sample this prompt lands in is once the prompt is in (0 for a new
        sample): what a call has used of the response budget before it generates."""
        i = self.parent(prompt_ids)
        if i is None:
            return 0
        sample = self._samples[i]
        return sample.response_length + len(prompt_ids) - len(sample.tokens)

    def mark_truncated(self, prompt_ids: list[int]) -> None:
        """A call was refused for lack of response budget: its sample ends TRUNCATED."""
        i = self.parent(prompt_ids)
        if i is not None:
            self._truncated.add(i)

    def add(self, call: CallRecord) -> int:
        """Add the call as a node of the tree; returns the position of the sample it went into."""
        node, parent_node = len(self._tips), self.parent_node(call.prompt_ids)
        i = self.parent(call.prompt_ids)
        if i is None:
            i = len(self._samples)
            self._samples.append(self._new_sample(call.prompt_ids, part=i))
            self._last_call.append(call)
            extension: list[int] = []
        else:
            extension = call.prompt_ids[len(self._samples[i].tokens):]
            self._last_call[i] = call
        if parent_node is not None:
            self._has_child.add(parent_node)
        self._tips.append(list(call.prompt_ids) + list(call.output_ids))
        self._parents.append(parent_node)
        self._node_sample.append(i)
        sample = self._samples[i]
        if extension:
            sample.append_response(extension, trainable=False)
        sample.append_response(call.output_ids, log_probs=call.output_log_probs,
                               weight_versions=call.weight_versions, trainable=True,
                               routed_experts=call.routed_experts)
        sample.metadata.setdefault("capture_calls", []).append(
            {**call.info, "node": node, "parent_node": parent_node, "prompt_tokens": len(call.prompt_ids),
             "context_tokens": len(extension), "completion_tokens": len(call.output_ids),
             "finish_reason": call.finish_reason})
        return i

    def _new_sample(self, prompt_ids: list[int], part: int) -> Sample:
        if part == 0:
            sample = self.base
            sample.reset_response()
            sample.tokens = list(prompt_ids)
            return sample
        metadata = copy.deepcopy({k: v for k, v in self.base.metadata.items() if k != "capture_calls"})
        metadata.update(parent_index=self.base.index, trajectory_part=part)
        return Sample(index=fanout_index(self.base.index, part), group_index=self.base.group_index,
                      prompt=copy.deepcopy(self.base.prompt), tokens=list(prompt_ids),
                      label=copy.deepcopy(self.base.label), metadata=metadata)

    def samples(self, reward: float | None = None) -> list[Sample]:
        """Every sample with its status (from its last call's finish reason; TRUNCATED when the budget ran
        out) and, when given, `reward` (the trajectory's, on each of its samples); each its loss_weight
        1 / (number of samples) (the trajectory weighs one sample in the loss)."""
        for i, (sample, last) in enumerate(zip(self._samples, self._last_call)):
            sample.status = Status.TRUNCATED if i in self._truncated and last.finish_reason == "stop" \
                else FINISH_TO_STATUS[last.finish_reason]
            if reward is not None:
                sample.reward = reward
            sample.metadata["trajectory_parts"] = len(self._samples)
            sample.loss_weight = 1.0 / len(self._samples)
            sample.check()
        return list(self._samples)
