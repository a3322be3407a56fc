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
    images: tuple[str, ...] = ()  # the prompt's images in order (the URLs sent), and their pixels' keys
    image_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.images) != len(self.image_keys):
            raise ValueError(f"call: {len(self.images)} images but {len(self.image_keys)} image keys")
        n = len(self.output_ids)
        if len(self.output_log_probs) != n or len(self.weight_versions) != n:
            raise ValueError(f"call: {n} output ids but {len(self.output_log_probs)} log-probs and "
                             f"{len(self.weight_versions)} versions")
        if self.finish_reason not in FINISH_TO_STATUS:
            raise ValueError(f"call: unknown finish reason {self.finish_reason!r}")
        if not self.prompt_ids:
            raise ValueError("call: empty prompt")


def splice_prompt_ids(text: str, tips: list[tuple[str, list[int], tuple[str, ...]]],
                      encode: Callable[[str, int], list[int]], image_keys: tuple[str, ...] = ()) -> list[int]:
    """The prompt ids of rendered `text` showing the images `image_keys`: when it starts with the text of
    an earlier call's prompt + output and that call showed the first of these images (`tips`: (text, ids,
    image keys); the longest match), those very ids followed by the rest encoded, so the model's sampled
    ids are never re-tokenized; else the whole text encoded. `encode(rest, skip)`: the ids of `rest`,
    whose images are image_keys[skip:]."""
    best: tuple[str, list[int], tuple[str, ...]] | None = None
    for tip in tips:
        same_images = image_keys[:len(tip[2])] == tip[2]
        if text.startswith(tip[0]) and same_images and (best is None or len(tip[0]) > len(best[0])):
            best = tip
    if best is None:
        return encode(text, 0)
    return list(best[1]) + encode(text[len(best[0]):], len(best[2]))


class TrajectoryAssembler:
    """Adds calls in the order they finished; `samples()` is the result. The first Sample is `base`
    itself (its tokens replaced by the first call's prompt), so it keeps its identity in the group."""

    def __init__(self, base: Sample):
        self.base = base
        self._samples: list[Sample] = []
        self._last_call: list[CallRecord] = []  # per sample
        self._truncated: set[int] = set()  # samples whose response budget ran out before a call
        self._tips: list[list[int]] = []  # per node: its prompt + output ids
        self._tip_images: list[tuple[str, ...]] = []  # per node: its prompt's image keys
        self._parents: list[int | None] = []  # per node
        self._node_sample: list[int] = []  # per node: the sample it trains in
        self._has_child: set[int] = set()

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def parents(self) -> list[int | None]:
        """The tree: per call (in the order added), its parent call, None for a root."""
        return list(self._parents)

    def parent_node(self, prompt_ids: list[int], image_keys: tuple[str, ...] = ()) -> int | None:
        """The call whose prompt + output ids are the longest exact prefix of `prompt_ids`, and whose images
        are the first of `image_keys` (same-sized pictures have the same pads; None: a root)."""
        best, best_len = None, -1
        for node, tip in enumerate(self._tips):
            n, keys = len(tip), self._tip_images[node]
            if best_len < n <= len(prompt_ids) and prompt_ids[:n] == tip and image_keys[:len(keys)] == keys:
                best, best_len = node, n
        return best

    def parent(self, prompt_ids: list[int], image_keys: tuple[str, ...] = ()) -> int | None:
        """The sample a call with these prompt ids continues: its parent call's, when that call has no
        child yet (None: the call starts a new sample)."""
        node = self.parent_node(prompt_ids, image_keys)
        return None if node is None or node in self._has_child else self._node_sample[node]

    def response_length_after_prompt(self, prompt_ids: list[int], image_keys: tuple[str, ...] = ()) -> int:
        """How long the response of the sample this prompt lands in is once the prompt is in (0 for a new
        sample): what a call has used of the response budget before it generates."""
        i = self.parent(prompt_ids, image_keys)
        if i is None:
            return 0
        sample = self._samples[i]
        return sample.response_length + len(prompt_ids) - len(sample.tokens)

    def mark_truncated(self, prompt_ids: list[int], image_keys: tuple[str, ...] = ()) -> None:
        """A call was refused for lack of response budget: its sample ends TRUNCATED."""
        i = self.parent(prompt_ids, image_keys)
        if i is not None:
            self._truncated.add(i)

    def add(self, call: CallRecord) -> int:
        """Add the call as a node of the tree; returns the position of the sample it went into."""
        node, parent_node = len(self._tips), self.parent_node(call.prompt_ids, call.image_keys)
        i = self.parent(call.prompt_ids, call.image_keys)
        if i is None:
            i = len(self._samples)
            self._samples.append(self._new_sample(call.prompt_ids, part=i))
            self._samples[i].multimodal_inputs = {"images": list(call.images)} if call.images else None
            self._samples[i].multimodal_train_inputs = None  # the session computes them for these images
            self._last_call.append(call)
            extension: list[int] = []
        else:
            extension = call.prompt_ids[len(self._samples[i].tokens):]
            _add_images(self._samples[i], call.images)
            self._last_call[i] = call
        if parent_node is not None:
            self._has_child.add(parent_node)
        self._tips.append(list(call.prompt_ids) + list(call.output_ids))
        self._tip_images.append(call.image_keys)
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


def _add_images(sample: Sample, images: tuple[str, ...]) -> None:
    """A continuing call's images: the sample's (its earlier calls', the same pictures) and the new ones,
    which came in context (`prompt_images`: how many the sample's prompt holds, Sample's meaning)."""
    inputs = sample.multimodal_inputs or {"images": []}
    if len(images) > len(inputs["images"]):
        inputs.setdefault("prompt_images", len(inputs["images"]))
        inputs["images"] = list(inputs["images"]) + list(images[len(inputs["images"]):])
        sample.multimodal_inputs = inputs
