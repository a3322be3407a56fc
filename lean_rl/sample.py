"""The unit of data that flows from rollout through the buffer to training."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from lean_rl import routed_experts as routes
from lean_rl import sample_images as images

# weight_versions entry for tokens the policy did not generate (tool output, environment text).
NOT_GENERATED = -1
# metadata key: the reward of the prompt's greedy response, set on every sample of a group by the
# default rollout under --advantage-estimator remax (its baseline)
REMAX_BASELINE_REWARD = "remax_baseline_reward"


class Status(str, Enum):
    PENDING = "pending"  # not generated yet, or partially generated and waiting to resume
    COMPLETED = "completed"  # the model stopped by itself (eos / stop string)
    TRUNCATED = "truncated"  # hit the response-length budget
    ABORTED = "aborted"  # interrupted (weight update, surplus after over-sampling); may resume
    FAILED = "failed"  # generation or reward failed: counted, never trained on nor in its group's statistics


@dataclass
class Sample:
    """One prompt + one response.

    `tokens` holds prompt and response ids. The per-token lists (`loss_mask`, `rollout_log_probs`,
    `weight_versions`) cover the response part only, so each has length `response_length`; change them
    through `append_response` to keep that true. `teacher_log_probs` (on-policy distillation, --use-opd)
    is empty until the teacher scored the whole response, then `response_length` long too (so are
    `teacher_top_ids` / `teacher_top_log_probs` under --opd-estimator topk).
    """

    index: int
    group_index: int
    prompt: str | list[dict[str, Any]] | int | float | bool  # a scalar: e.g. a task index (slime's tau-bench)
    tokens: list[int]
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | None = None
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    # --use-opd: the teacher's log p(response token | everything before it), set by
    # rollout/distillation.py once the response is final ([] before, and after any change of it)
    teacher_log_probs: list[float] = field(default_factory=list)
    # --opd-estimator topk: at each response token, the teacher's --opd-top-k likeliest token ids and their
    # log-probs ([] until the teacher scored the final response, as teacher_log_probs)
    teacher_top_ids: list[list[int]] = field(default_factory=list)
    teacher_top_log_probs: list[list[float]] = field(default_factory=list)
    # --use-rollout-routing-replay: the engine's experts for tokens[:-1], base64 int32 [len(tokens) - 1,
    # layers, topk] (lean_rl/routed_experts.py; NO_ROUTE rows: tokens the engine never took as input).
    # None: not recorded. The newest engine call's routes replace the old (its input was every token).
    routed_experts: str | None = None
    # this sample's share of its trajectory in the loss: a trajectory recorded as n samples (a capture
    # session's call tree, openai_capture/trajectory.py) gives each 1/n, so it weighs as one sample does.
    # Multiplies the sample's token weights in the loss aggregation (algorithms/losses.aggregation_weights).
    loss_weight: float = 1.0
    # image prompts (--multimodal-keys; lean_rl/sample_images.py): the raw images ({"images": [...]}) and
    # the processor's outputs for the trainer ({"pixel_values", "image_grid_thw"}); `tokens` hold one
    # image pad per vision token (the processor's expansion). None: a text sample.
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length:]

    @property
    def oldest_version(self) -> int | None:
        """Oldest policy version that generated any token of the response (None: nothing generated)."""
        generated = [v for v in self.weight_versions if v != NOT_GENERATED]
        return min(generated) if generated else None

    def append_response(
        self,
        token_ids: list[int],
        text: str = "",
        log_probs: list[float] | None = None,
        weight_versions: list[int] | int | None = None,
        trainable: bool = True,
        routed_experts: str | None = None,
    ) -> None:
        """Extend the response. Policy tokens come with their log-probs and versions; tool or
        environment tokens (trainable=False) get loss-mask 0, log-prob 0 and NOT_GENERATED.
        `routed_experts`: the engine's routes of the whole new sequence (the call's input was `tokens`);
        without them, routes already held grow by NO_ROUTE rows."""
        n = len(token_ids)
        rows_before = len(self.tokens) - 1
        if trainable:
            if log_probs is None or weight_versions is None:
                raise ValueError("append_response: policy tokens need log_probs and weight_versions")
            if isinstance(weight_versions, int):
                weight_versions = [weight_versions] * n
            if len(log_probs) != n or len(weight_versions) != n:
                raise ValueError(
                    f"append_response: {n} tokens but {len(log_probs)} log-probs and "
                    f"{len(weight_versions)} versions (sample {self.index})"
                )
        else:
            log_probs, weight_versions = [0.0] * n, [NOT_GENERATED] * n
        self.tokens.extend(token_ids)
        self.clear_teacher()  # it scored the shorter response: the teacher scores again
        self.response += text
        self.response_length += n
        self.loss_mask.extend([1 if trainable else 0] * n)
        self.rollout_log_probs.extend(map(float, log_probs))  # map: no Python frame per token
        self.weight_versions.extend(map(int, weight_versions))
        if routed_experts:
            self.routed_experts = routed_experts
        elif self.routed_experts is not None:
            self.routed_experts = routes.extend(self.routed_experts, rows_before, n)

    def reset_response(self) -> None:
        """Drop the response (e.g. a sample whose partial tokens are too stale to keep)."""
        del self.tokens[self.prompt_length:]
        self.response, self.response_length = "", 0
        self.loss_mask, self.rollout_log_probs, self.weight_versions = [], [], []
        self.clear_teacher()
        self.routed_experts = None
        self.reward, self.status = None, Status.PENDING
        if self.multimodal_inputs is not None and "prompt_images" in self.multimodal_inputs:
            first = self.multimodal_inputs.pop("prompt_images")  # images later turns added go with them
            self.multimodal_inputs["images"] = self.multimodal_inputs["images"][:first]
            self.multimodal_train_inputs = None  # the rollout computes them again for the prompt's images
            if not first:  # a text prompt that only later turns showed images to
                self.multimodal_inputs = None

    def clear_teacher(self) -> None:
        self.teacher_log_probs, self.teacher_top_ids, self.teacher_top_log_probs = [], [], []

    def check(self) -> None:
        """Raise if the per-token lists disagree with response_length (cheap; call at boundaries)."""
        lengths = {len(self.loss_mask), len(self.rollout_log_probs), len(self.weight_versions)}
        if (lengths != {self.response_length} or self.response_length > len(self.tokens)
                or len(self.teacher_log_probs) not in (0, self.response_length)):
            raise ValueError(
                f"sample {self.index}: response_length {self.response_length}, tokens {len(self.tokens)}, "
                f"loss_mask {len(self.loss_mask)}, rollout_log_probs {len(self.rollout_log_probs)}, "
                f"weight_versions {len(self.weight_versions)}, teacher_log_probs {len(self.teacher_log_probs)} "
                "(0 or response_length)"
            )
        top_lengths = {len(self.teacher_top_ids), len(self.teacher_top_log_probs)}
        if top_lengths - {0, self.response_length} or len(top_lengths) > 1 or any(
                len(ids) != len(lps) for ids, lps in zip(self.teacher_top_ids, self.teacher_top_log_probs)):
            raise ValueError(f"sample {self.index}: teacher_top_ids and teacher_top_log_probs must both hold one row "
                             f"per response token ({self.response_length}) of equal widths, or be empty; got "
                             f"{len(self.teacher_top_ids)} and {len(self.teacher_top_log_probs)} rows")
        if not (isinstance(self.loss_weight, (int, float)) and not isinstance(self.loss_weight, bool)
                and math.isfinite(self.loss_weight) and self.loss_weight > 0):
            raise ValueError(f"sample {self.index}: loss_weight must be a finite number > 0, got {self.loss_weight!r}")
        if self.routed_experts is not None:
            try:
                routes.width(self.routed_experts, len(self.tokens) - 1)  # one row per token but the last
            except ValueError as err:
                raise ValueError(f"sample {self.index}: {err}") from None
        images.check_images(f"sample {self.index}", self.multimodal_inputs, self.multimodal_train_inputs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the image arrays as base64, sample_images.py)."""
        out = asdict(self)
        out["status"] = self.status.value
        if self.multimodal_train_inputs is not None:
            out["multimodal_train_inputs"] = images.encode_train_inputs(self.multimodal_train_inputs)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        """The inverse of to_dict; ValueError naming the field when `data` is not a saved sample."""
        if not isinstance(data, dict):
            raise ValueError(f"a sample must be a JSON object, got {type(data).__name__}")
        missing = [k for k in _REQUIRED if k not in data]
        unknown = sorted(set(data) - set(_FIELD_TYPES))
        if missing or unknown:
            raise ValueError(f"sample {data.get('index', '?')}: "
                             + "; ".join(([f"missing field(s) {missing}"] if missing else [])
                                         + ([f"unknown field(s) {unknown}"] if unknown else [])))
        data = dict(data)
        for name, (types, element) in _FIELD_TYPES.items():
            value = data.get(name)
            if name not in data or name == "label" or (value is None and name in _NULLABLE):
                continue
            ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
            if ok and element is not None:
                ok = all(isinstance(x, element) and not isinstance(x, bool) for x in value)
            if not ok:
                raise ValueError(f"sample {data.get('index', '?')}: field {name!r} must be "
                                 f"{_TYPE_NAMES[name]}, got {str(value)[:80]!r}")
        try:
            data["status"] = Status(data.get("status", Status.PENDING.value))
        except ValueError:
            raise ValueError(f"sample {data['index']}: field 'status' must be one of "
                             f"{[s.value for s in Status]}, got {data['status']!r}") from None
        if data.get("multimodal_train_inputs") is not None:
            data["multimodal_train_inputs"] = images.decode_train_inputs(data["multimodal_train_inputs"],
                                                                         f"sample {data['index']}")
        sample = cls(**data)
        sample.check()
        return sample


# from_dict's checks: field -> (accepted types, element type of a list or None)
_REQUIRED = ("index", "group_index", "prompt", "tokens")
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], Any]] = {
    "index": ((int,), None), "group_index": ((int,), None), "prompt": ((str, list, int, float), None),
    "tokens": ((list,), int), "response": ((str,), None), "response_length": ((int,), None),
    "label": ((object,), None), "reward": ((int, float), None), "loss_mask": ((list,), int),
    "rollout_log_probs": ((list,), (int, float)), "weight_versions": ((list,), int), "status": ((str,), None),
    "metadata": ((dict,), None), "teacher_log_probs": ((list,), (int, float)), "routed_experts": ((str,), None),
    "teacher_top_ids": ((list,), list), "teacher_top_log_probs": ((list,), list),
    "loss_weight": ((int, float), None),
    "multimodal_inputs": ((dict,), None), "multimodal_train_inputs": ((dict,), None),
}
_NULLABLE = ("reward", "routed_experts", "multimodal_inputs", "multimodal_train_inputs")
_TYPE_NAMES = {"index": "an integer", "group_index": "an integer", "prompt": "text, a list of messages or a number",
               "tokens": "a list of token ids", "response": "text", "response_length": "an integer",
               "label": "anything", "reward": "a number or null", "loss_mask": "a list of 0/1",
               "rollout_log_probs": "a list of numbers", "weight_versions": "a list of integers",
               "status": "a status string", "metadata": "an object", "teacher_log_probs": "a list of numbers",
               "teacher_top_ids": "a list of lists of token ids", "teacher_top_log_probs": "a list of lists of numbers",
               "routed_experts": "base64 text or null",
               "loss_weight": "a number > 0", "multimodal_inputs": "an object or null",
               "multimodal_train_inputs": "an object or null"}
