"""A Sample's image fields (issue 44): what they must hold, and how they travel as JSON.

    multimodal_inputs        {"images": [path | file:// URL | base64, ...]}: the prompt row's images, then those
                             later turns added ("prompt_images": how many the prompt gave, present once a
                             turn added one: reset_response drops the rest)
    multimodal_train_inputs  the HF image processor's outputs for those images, what the trainer's vision
                             tower takes: {"pixel_values": float32 [patches, D], "image_grid_thw": int64 [images, 3]}

Checkpoints, --save-debug-rollout-data and the sample dumps are JSON: the arrays are written as
{"dtype", "shape", "base64"} (little-endian bytes), read back bit for bit.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

TRAIN_DTYPES = {"pixel_values": np.dtype("float32"), "image_grid_thw": np.dtype("int64")}


def encode_train_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    return {key: {"dtype": str(value.dtype), "shape": list(value.shape),
                  "base64": base64.b64encode(np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"))
                                             .tobytes()).decode()}
            for key, value in inputs.items()}


def decode_train_inputs(data: dict[str, Any], where: str) -> dict[str, np.ndarray]:
    out = {}
    for key, value in data.items():
        if isinstance(value, np.ndarray):  # not from JSON: already arrays
            out[key] = value
            continue
        try:
            dtype = np.dtype(value["dtype"]).newbyteorder("<")
            array = np.frombuffer(base64.b64decode(value["base64"], validate=True), dtype=dtype)
            out[key] = array.reshape([int(n) for n in value["shape"]]).astype(dtype.newbyteorder("="))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: field 'multimodal_train_inputs'[{key!r}] is not a saved array "
                             f"({{dtype, shape, base64}}): {err}") from None
    return out


def check_images(where: str, inputs: dict[str, Any] | None, train: dict[str, Any] | None) -> None:
    """Raise ValueError (naming the field) unless the two fields hold what the module doc says."""
    if inputs is not None:
        images = inputs.get("images") if isinstance(inputs, dict) else None
        if not (isinstance(images, list) and images and all(isinstance(i, str) and i for i in images)):
            raise ValueError(f"{where}: multimodal_inputs must be {{'images': [non-empty text, ...]}}, got "
                             f"{str(inputs)[:80]!r}")
        unknown = sorted(set(inputs) - {"images", "prompt_images"})
        first = inputs.get("prompt_images", 0)
        if unknown or not (isinstance(first, int) and 0 <= first <= len(images)):
            raise ValueError(f"{where}: multimodal_inputs: unknown key(s) {unknown} or prompt_images {first!r} "
                             f"not in 0..{len(images)}")
    if train is None:
        return
    if inputs is None:
        raise ValueError(f"{where}: multimodal_train_inputs without multimodal_inputs (the images they came from)")
    if not isinstance(train, dict) or set(train) != set(TRAIN_DTYPES) or not all(
            isinstance(train[k], np.ndarray) and train[k].dtype == dtype for k, dtype in TRAIN_DTYPES.items()):
        raise ValueError(f"{where}: multimodal_train_inputs must be {{'pixel_values': float32 array, "
                         f"'image_grid_thw': int64 array}}, got {_described(train)}")
    grid, pixels = train["image_grid_thw"], train["pixel_values"]
    n_images = len(inputs["images"])
    if grid.shape != (n_images, 3) or pixels.ndim != 2 or pixels.shape[0] != int(grid.prod(axis=1).sum()):
        raise ValueError(f"{where}: multimodal_train_inputs: image_grid_thw {list(grid.shape)} for {n_images} "
                         f"images and pixel_values {list(pixels.shape)} (rows must be the grids' t*h*w summed, "
                         f"{int(grid.prod(axis=1).sum()) if grid.ndim == 2 else '?'})")


def _described(value: Any) -> str:
    if not isinstance(value, dict):
        return type(value).__name__
    return "{" + ", ".join(f"{k!r}: {getattr(v, 'dtype', type(v).__name__)}" for k, v in value.items()) + "}"
