"""Reference-model weights for KL: a CPU copy of this rank's shard of the reference parameters,
swapped into the live model only while reference log-probs are computed. One model in device memory,
no second actor group; the swap costs two copies of the rank's parameters per rollout (the
reference pass itself is a forward over the whole rollout, which dominates)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def _parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return dict(model.named_parameters())


class ReferenceWeights:
    def __init__(self, model: torch.nn.Module):
        """Snapshot the model's current parameters as the reference."""
        self._weights = {name: param.detach().to("cpu", copy=True) for name, param in _parameters(model).items()}

    @contextlib.contextmanager
    def swapped_in(self, model: torch.nn.Module) -> Iterator[None]:
        """Inside: the model holds the reference weights. On exit (also on error) the policy weights
        are back, bit for bit."""
        params = _parameters(model)
        if params.keys() != self._weights.keys():
            missing = sorted(params.keys() ^ self._weights.keys())[:5]
            raise RuntimeError(f"reference weights do not match the model's parameters (e.g. {missing})")
        policy = {name: param.detach().to("cpu", copy=True) for name, param in params.items()}
        try:
            with torch.no_grad():
                for name, param in params.items():
                    param.copy_(self._weights[name])
            yield
        finally:
            with torch.no_grad():
                for name, param in params.items():
                    param.copy_(policy[name])

    def copy_into(self, model: torch.nn.Module) -> None:
        """Overwrite the model's parameters with these weights (used to put a policy back)."""
        with torch.no_grad():
            for name, param in _parameters(model).items():
                param.copy_(self._weights[name])
