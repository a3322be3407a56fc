"""The unit of data that flows from rollout through the buffer to training."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

# weight_versions entry for tokens the policy did not generate (tool output, environment text).
NOT_GENERATED = -1


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
    through `append_response` to keep that true.
    """

    index: int
    group_index: int
    prompt: str | list[dict[str, Any]]
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
    ) -> None:
        """Extend the response. Policy tokens come with their log-probs and versions; tool or
        environment tokens (trainable=False) get loss-mask 0, log-prob 0 and NOT_GENERATED."""
        n = len(token_ids)
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
        self.response += text
        self.response_length += n
        self.loss_mask.extend([1 if trainable else 0] * n)
        self.rollout_log_probs.extend(float(x) for x in log_probs)
        self.weight_versions.extend(int(v) for v in weight_versions)

    def reset_response(self) -> None:
        """Drop the response (e.g. a sample whose partial tokens are too stale to keep)."""
        del self.tokens[self.prompt_length:]
        self.response, self.response_length = "", 0
        self.loss_mask, self.rollout_log_probs, self.weight_versions = [], [], []
        self.reward, self.status = None, Status.PENDING

    def check(self) -> None:
        """Raise if the per-token lists disagree with response_length (cheap; call at boundaries)."""
        lengths = {len(self.loss_mask), len(self.rollout_log_probs), len(self.weight_versions)}
        if lengths != {self.response_length} or self.response_length > len(self.tokens):
            raise ValueError(
                f"sample {self.index}: response_length {self.response_length}, tokens {len(self.tokens)}, "
                f"loss_mask {len(self.loss_mask)}, rollout_log_probs {len(self.rollout_log_probs)}, "
                f"weight_versions {len(self.weight_versions)}"
            )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        data = dict(data)
        data["status"] = Status(data.get("status", Status.PENDING.value))
        sample = cls(**data)
        sample.check()
        return sample
