"""Errors of a weight sync; each message names the engine (URL), the trainer rank or the flag."""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A weight sync failed."""


class WeightSyncProbeError(WeightSyncError):
    """After a sync an engine does not serve the trainer's weights: its log-probs on the probe
    sequence differ by more than the tolerance, or it reports another weight version."""

    def __init__(self, message: str, *, engine_url: str, max_abs_diff: float | None,
                 tensors: list[str] | None):
        super().__init__(message)
        self.engine_url = engine_url
        self.max_abs_diff = max_abs_diff
        self.tensors = tensors  # engine parameters whose bytes differ from the trainer's (None: not checked)
