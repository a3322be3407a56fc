"""slime.utils.types: slime's Sample (fields, Status, SpecInfo, PrefixCacheInfo, append_response_tokens,
get_reward_value, effective_response_length, to_dict / from_dict), written from its behaviour at 624b824.

append_response_tokens mutates as slime's does: `tokens`, `loss_mask` and `rollout_log_probs` are
extended in place (a caller that kept a reference to one of these lists sees the new entries); only a
list that is None is created, and `response` (a str) is rebound.

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
    multimodal_train_input_id: str | None = None
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

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters summed over a sample's /generate answers."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num else 0.0

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct else 0.0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)  # SGLang's name differs

        def to_dict(self) -> dict[str, int]:
            return dict(self.__dict__)

        @staticmethod
        def from_dict(data: dict) -> Sample.SpecInfo:
            return Sample.SpecInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.SpecInfo)})

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        """Prompt tokens SGLang found in its prefix cache, summed over a sample's /generate answers."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens else 0.0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dict(self.__dict__)

        @staticmethod
        def from_dict(data: dict) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.PrefixCacheInfo)})

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        value = dict(self.__dict__)  # ad-hoc attributes too, as slime's does
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data.get("status", "pending"))
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info") or {})
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info") or {})
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
            self.tokens += tokens  # in place, as slime's: a reference kept to these lists sees the tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * before
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError("Cannot append trainable rollout log probabilities to a sample with existing "
                                     "response tokens but no existing rollout_log_probs.")
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += log_probs
        if meta_info and update_terminal_info and "finish_reason" in meta_info:
            self._record_answer(args, meta_info)
        for name in ("loss_mask", "rollout_log_probs"):
            values = getattr(self, name)
            if values is not None and len(values) != self.response_length:
                raise ValueError(f"{name} length {len(values)} != response_length {self.response_length}")

    def _record_answer(self, args, meta_info: dict) -> None:
        """What a finished /generate answer's meta_info tells: counters, weight version, status."""
        if getattr(args, "sglang_speculative_algorithm", None):
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        finish = meta_info["finish_reason"]
        kind = finish.get("type") if isinstance(finish, dict) else finish
        status = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED,
                  "stop": Sample.Status.COMPLETED}.get(str(kind))
        if status is not None:
            self.status = status
