"""Images in generation (--multimodal-keys): what a sample's /generate sends, and the trainer's image inputs.

A sample's `tokens` hold the HF processor's expansion of its images (one pad per vision token), which is
what the trainer computes log-probs over. SGLang takes ONE pad per image plus the images and expands
them itself (backends/sglang/image_prompt.py), so each request sends the collapsed ids and every image
of the sample, the prompt's and those later turns added, in order: a turn's context keeps all earlier
images. The collapse checks that each run of pads is exactly its image's expansion (grid t*h*w / merge²
from the processor), so the prompt Sample records is token for token the one the engine expanded.

    engine_prompt(model_path, sample) -> EnginePrompt      (also fills sample.multimodal_train_inputs)
    append_image_turn(model_path, sample, text, images)     (a later turn with images: not trained on)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lean_rl.backends.sglang.image_prompt import collapse_image_pads
from lean_rl.buffer.images import ImageError, image_data_uri, load_image, load_processor
from lean_rl.sample import Sample


@dataclass(frozen=True)
class EnginePrompt:
    """A /generate prompt: token ids, and for an image prompt its images (data URLs) and pad token id."""

    input_ids: list[int]
    image_data: list[str] | None = None
    image_token_id: int | None = None


def image_token_id(processor) -> int:
    token_id = getattr(processor, "image_token_id", None)
    return int(token_id if token_id is not None else processor.tokenizer.convert_tokens_to_ids(processor.image_token))


def train_inputs(processor, images: list) -> dict[str, np.ndarray]:
    """The image processor's outputs for `images`, as Sample.multimodal_train_inputs holds them."""
    out = processor.image_processor(images=images, return_tensors="np")
    return {"pixel_values": np.asarray(out["pixel_values"], dtype=np.float32),
            "image_grid_thw": np.asarray(out["image_grid_thw"], dtype=np.int64)}


def tokens_per_image(processor, grid: np.ndarray) -> list[int]:
    merge = int(processor.image_processor.merge_size)
    return [int(n) // (merge * merge) for n in grid.prod(axis=1)]


def _images(sample: Sample) -> list:
    assert sample.multimodal_inputs is not None
    loaded = []
    for i, ref in enumerate(sample.multimodal_inputs["images"]):
        try:
            loaded.append(load_image(ref))
        except ImageError as err:
            raise ValueError(f"sample {sample.index} (prompt row {sample.metadata.get('prompt_row', '?')}): "
                             f"image {i}: {err}") from None
    return loaded


def engine_prompt(model_path: str | None, sample: Sample) -> EnginePrompt:
    """What /generate gets for `sample`; computes multimodal_train_inputs when missing (or stale).
    `model_path`: the served checkpoint (its processor)."""
    if sample.multimodal_inputs is None:
        return EnginePrompt(sample.tokens)
    if model_path is None:
        raise ValueError(f"sample {sample.index} has images but the engines name no checkpoint (processor)")
    processor = load_processor(model_path)
    images = _images(sample)
    train = sample.multimodal_train_inputs
    if train is None or len(train["image_grid_thw"]) != len(images):
        sample.multimodal_train_inputs = train = train_inputs(processor, images)
    pad = image_token_id(processor)
    try:
        ids = collapse_image_pads(sample.tokens, pad, tokens_per_image(processor, train["image_grid_thw"]))
    except ValueError as err:
        raise ValueError(f"sample {sample.index}: {err}") from None
    return EnginePrompt(ids, [image_data_uri(image) for image in images], pad)


def append_image_turn(model_path: str, sample: Sample, text: str, images: list[str]) -> None:
    """Append a turn that shows `images` (paths, file:// URLs or base64) as context, not trained on.
    `text` is the turn as the model's chat format writes it, with the processor's image token
    (Qwen: "<|vision_start|><|image_pad|><|vision_end|>") once per image; the processor expands it."""
    processor = load_processor(model_path)
    if text.count(processor.image_token) != len(images):
        raise ValueError(f"append_image_turn: {len(images)} image(s) but {text.count(processor.image_token)} "
                         f"{processor.image_token} in the text")
    loaded = [load_image(ref) for ref in images]
    ids = [int(t) for t in processor(text=[text], images=loaded, return_tensors="np")["input_ids"][0]]
    inputs = sample.multimodal_inputs or {"images": []}
    inputs.setdefault("prompt_images", len(inputs["images"]))
    inputs["images"] = list(inputs["images"]) + list(images)
    sample.multimodal_inputs = inputs
    sample.multimodal_train_inputs = None  # engine_prompt computes them for all the images
    sample.append_response(ids, processor.tokenizer.decode(ids), trainable=False)
