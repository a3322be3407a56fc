"""slime.rollout.base_types: what a slime rollout function returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lean_rl.slime_compat.types import Sample


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None
