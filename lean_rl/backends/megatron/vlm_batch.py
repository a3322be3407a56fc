"""A micro-batch's image inputs for the vision-language actor: the samples' `multimodal_train_inputs`
(the HF processor's `pixel_values` [N_patches, D] float32 and `image_grid_thw` [n_images, 3] int64, numpy)
stacked in row order, and the M-RoPE position ids [3, b, s] of the rows, computed by transformers' own
Qwen2.5-VL rule (get_rope_index) so trainer and engines place image tokens alike."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any, Mapping, Sequence, cast

import numpy as np
import torch


@dataclass(frozen=True)
class ImageInputs:
    pixel_values: torch.Tensor  # [N_patches, D], the rows' images one after another
    image_grid_thw: torch.Tensor  # [n_images, 3] int64, same order
    images_per_row: tuple[int, ...]


def stack_image_inputs(per_row: Sequence[Mapping[str, Any] | None], tokens: torch.Tensor, image_token_id: int,
                       merge_size: int) -> ImageInputs | None:
    """The micro-batch's images, or None when no row has any. Each row's count of image-pad tokens must
    be what its grids expand to (t*h*w / merge²): a row that disagrees is one error naming the row."""
    pixels, grids, counts = [], [], []
    for row, inputs in enumerate(per_row):
        pads = int((tokens[row] == image_token_id).sum())
        if not inputs:
            if pads:
                raise ValueError(f"multimodal_train_inputs of row {row}: none, but its tokens hold {pads} image pads")
            counts.append(0)
            continue
        missing = [k for k in ("pixel_values", "image_grid_thw") if k not in inputs]
        if missing:
            raise ValueError(f"multimodal_train_inputs of row {row}: missing {', '.join(missing)}")
        grid = torch.as_tensor(np.asarray(inputs["image_grid_thw"]), dtype=torch.long).reshape(-1, 3)
        pixel = torch.as_tensor(np.asarray(inputs["pixel_values"], dtype=np.float32))
        if pixel.dim() != 2 or pixel.shape[0] != int(grid.prod(-1).sum()):
            raise ValueError(f"multimodal_train_inputs of row {row}: pixel_values {tuple(pixel.shape)} does not "
                             f"hold the {int(grid.prod(-1).sum())} patches image_grid_thw {grid.tolist()} implies")
        expected = int((grid.prod(-1) // (merge_size * merge_size)).sum())
        if pads != expected:
            raise ValueError(f"multimodal_train_inputs of row {row}: image_grid_thw {grid.tolist()} makes {expected} "
                             f"image tokens, the row's tokens hold {pads} image pads")
        pixels.append(pixel)
        grids.append(grid)
        counts.append(int(grid.shape[0]))
    if not grids:
        return None
    return ImageInputs(torch.cat(pixels), torch.cat(grids), tuple(counts))


def mrope_position_ids(tokens: torch.Tensor, image_grid_thw: torch.Tensor | None, hf_config: Mapping[str, Any],
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """[3, b, s] M-RoPE positions of right-padded rows `tokens` [b, s] (text: t = h = w = index; each image:
    its (t, h, w) grid after the spatial merge, then text continues after the image's largest extent).
    transformers' Qwen2_5_VLModel.get_rope_index does the work; it reads only `config` and
    get_vision_position_ids (which uses no state), so it runs on a namespace holding those two."""
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    config = Qwen2_5_VLConfig(**{k: v for k, v in hf_config.items() if k in ("vision_config", "image_token_id")})
    holder = SimpleNamespace(config=config,
                             # it reads no state of `self`
                             get_vision_position_ids=partial(Qwen2_5_VLModel.get_vision_position_ids,
                                                             None))  # type: ignore[arg-type]
    image_token_id = int(hf_config["image_token_id"])
    token_types = (tokens == image_token_id).to(torch.int32)  # 1: image, 0: text (no video)
    if image_grid_thw is None or image_grid_thw.numel() == 0:
        token_types.zero_()
        image_grid_thw = None
    # transformers annotates Int/LongTensor (legacy tensor types): plain tensors of those dtypes
    positions, _ = Qwen2_5_VLModel.get_rope_index(holder, tokens,  # type: ignore[arg-type]
                                                  cast(torch.IntTensor, token_types),
                                                  image_grid_thw=cast("torch.LongTensor | None", image_grid_thw),
                                                  attention_mask=attention_mask)
    return positions


# micro-batch keys of the rows' images (train_batches.build_micro_batch): the rows' pixel_values and
# image_grid_thw concatenated in row order, what VisionLanguageModel.set_images takes
IMAGE_KEYS = ("pixel_values", "image_grid_thw")


def micro_batch_images(per_row: Sequence[Mapping[str, Any] | None]) -> dict[str, torch.Tensor]:
    """The IMAGE_KEYS tensors of a micro-batch's rows (their `multimodal_train_inputs`, in row order);
    empty when no row has images. The rank checks each image's pads against the tokens (the model)."""
    pixels, grids = [], []
    for row, inputs in enumerate(per_row):
        if not inputs:
            continue
        missing = [k for k in IMAGE_KEYS if k not in inputs]
        if missing:
            raise ValueError(f"multimodal_train_inputs of micro-batch row {row}: missing {', '.join(missing)}")
        pixels.append(torch.as_tensor(np.asarray(inputs["pixel_values"], dtype=np.float32)))
        grids.append(torch.as_tensor(np.asarray(inputs["image_grid_thw"]), dtype=torch.long).reshape(-1, 3))
    if not grids:
        return {}
    return {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)}


def set_micro_batch_images(model: Any, micro_batch: Mapping[str, torch.Tensor]) -> None:
    """Before a micro-batch's forward: hand its images to the VisionLanguageModel inside `model` (DDP or
    any wrapper with `.module`); a text model with images in the micro-batch is an error."""
    inner = model
    while not hasattr(inner, "set_images") and hasattr(inner, "module"):
        inner = inner.module
    has_images = IMAGE_KEYS[0] in micro_batch
    if not hasattr(inner, "set_images"):
        if has_images:
            raise ValueError("the micro-batch carries images (multimodal_train_inputs) but the trainer's model is a "
                             "text model: --hf-checkpoint must be a vision-language checkpoint")
        return
    inner.set_images(ImageInputs(torch.as_tensor(micro_batch["pixel_values"]),
                                 torch.as_tensor(micro_batch["image_grid_thw"]).long(), ()) if has_images else None)
