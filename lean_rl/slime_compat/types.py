"""slime.utils.types: slime's Sample (fields, Status, append_response_tokens, get_reward_value,
effective_response_length, to_dict / from_dict), written from its documented behaviour.

A user's generate function sees one of these; convert.py turns it into lean_rl's Sample on the way
out (per-token versions, loss mask, status) and back. Multimodal inputs, top-p replay and routed
experts are carried as plain fields: lean_rl trains text models and records routes itself."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any


def _ints(values) -> list[int]:
    if values is None:
        return []
    values = values.tolist() if hasattr(values, "tolist") else values  # torch / numpy
    return [int(v) for v in values]


def _floats(values) -> list[float] | None:
    if values is None:
        return None
    values = values.tolist() if hasattr(values, "tolist") else values
    return [float(v) for v in values]


@dataclass
class Sample:
    """One prompt and its response, as slime's functions read and write it."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)  # one per /generate answer, as slime records them
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        value = dict(self.__dict__)  # ad-hoc attributes too, as slime's does
        value["status"] = self.status.value
        return value

    @staticmethod
    def from_dict(data: dict) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data.get("status", "pending"))
        names = {f.name for f in fields(Sample)}
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args) -> Any:
        key = getattr(args, "reward_key", None)
        if not key:
            return self.reward
        if not isinstance(self.reward, dict):
            raise TypeError(f"--reward-key {key!r} is set but sample.reward is {self.reward!r}, not a dict")
        return self.reward[key]

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(self, args=None, *, tokens=None, log_probs=None, trainable: bool = True,
                               meta_info: dict | None = None, text: str | None = None,
                               update_terminal_info: bool = True) -> None:
        """Append response tokens keeping loss_mask and rollout_log_probs aligned: policy tokens
        (trainable) with their log-probs and the /generate answer's meta_info (its weight version and
        finish reason); tool or environment tokens (trainable=False) with mask 0 and log-prob 0."""
        tokens, log_probs = _ints(tokens), _floats(log_probs)
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)
        if text is not None:
            self.response += text
        before = self.response_length
        if tokens:
            self.tokens = list(self.tokens) + tokens
            self.response_length += len(tokens)
            self.loss_mask = (list(self.loss_mask) if self.loss_mask is not None else [1] * before) + \
                [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError("Cannot append trainable rollout log probabilities to a sample with existing "
                                     "response tokens but no existing rollout_log_probs.")
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs = list(self.rollout_log_probs) + log_probs
        if meta_info and update_terminal_info and "finish_reason" in meta_info:
            if "weight_version" in meta_info:
                self.weight_versions.append(meta_info["weight_version"])
            finish = meta_info["finish_reason"]
            kind = finish.get("type") if isinstance(finish, dict) else finish
            status = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED,
                      "stop": Sample.Status.COMPLETED}.get(str(kind))
            if status is not None:
                self.status = status
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}")
