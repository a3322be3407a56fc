"""The one place a run chooses its device: CUDA when this process sees a GPU, else CPU. Called once at
start-up (config.parse_config); everything else reads cfg.layout.device."""

from __future__ import annotations


def detect_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
