"""The images of a capture session (issue 44): an image_url part loaded, its vision tokens, what /generate
sends, and the trainer's inputs, all as the --multimodal-keys path computes them (buffer/images.py,
rollout/vision.py), so a captured trajectory trains like a data row with images.

Tokens: the chat template writes ONE image pad per image (Qwen: <|vision_start|><|image_pad|><|vision_end|>);
the recorded prompt ids hold the processor's expansion (each pad repeated t*h*w / merge² times, from the
image's grid), which is what the trainer computes log-probs over. The image pad is a special token, so
the text around it tokenizes alike either way and expanding the ids equals the processor's own
expansion (tests/unit/test_capture_images.py). /generate gets the ids with each run collapsed back to
one pad and every image of the conversation (rollout/vision.py's contract with SGLang).

An image is known by the hash of its RGB pixels (its key), so two calls that send the same picture under
different URLs (a path, then its base64) continue one Sample, and a picture changed behind the same
text does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lean_rl.backends.sglang.image_prompt import collapse_image_pads
from lean_rl.buffer.images import ImageError, image_data_uri, load_image, load_processor
from lean_rl.rollout.openai_capture.chat import RequestError
from lean_rl.rollout.openai_capture.image_parts import ImagePart
from lean_rl.rollout.vision import EnginePrompt, image_token_id, tokens_per_image, train_inputs
from lean_rl.sample import Sample


@dataclass(frozen=True)
class LoadedImage:
    ref: str  # the URL as the agent sent it: what Sample.multimodal_inputs records
    key: str  # sha256 of the RGB pixels and size
    image: Any  # PIL RGB image: what the processor and the engine see
    tokens: int  # its vision tokens in the prompt ids
    data_uri: str  # what /generate sends: the RGB pixels as PNG


def expand_image_pads(ids: Sequence[int], pad: int, counts: Sequence[int]) -> list[int]:
    """`ids` (one pad per image) with pad i repeated counts[i] times; RequestError when the pads are not
    one per image (a text part that writes the image token, or a sampled answer that holds it)."""
    found = sum(1 for t in ids if t == pad)
    if found != len(counts):
        raise RequestError(f"messages: the rendered prompt holds {found} image pad token(s) ({pad}) for {len(counts)} "
                           "image part(s); each image_url part is one pad (is the image token written in a text "
                           "part, or in an answer the model sampled?)", "messages")
    out: list[int] = []
    remaining = iter(counts)
    for token in ids:
        if token == pad:
            out.extend([pad] * next(remaining))
        else:
            out.append(int(token))
    return out


class SessionImages:
    """The images a session has seen (by URL), and the served checkpoint's processor (loaded on the first
    image: a text-only session never loads it)."""

    def __init__(self, model_path: str):
        self.model_path = model_path
        self._loaded: dict[str, LoadedImage] = {}
        self._processor: Any = None

    def processor(self, where: str) -> Any:
        if self._processor is None:
            try:
                processor = load_processor(self.model_path)
            except (OSError, ValueError) as err:
                raise RequestError(f"{where}: image parts need the served model's processor, which did not load "
                                   f"from {self.model_path}: {str(err).splitlines()[0][:200]}", where) from None
            if getattr(processor, "image_processor", None) is None or getattr(processor, "image_token", None) is None:
                raise RequestError(f"{where}: the served model {self.model_path} takes no images (its processor has "
                                   "no image processor)", where)
            self._processor = processor
        return self._processor

    @property
    def pad(self) -> int:
        return image_token_id(self._processor)

    def load(self, parts: Sequence[ImagePart]) -> tuple[LoadedImage, ...]:
        """Each part's image (RequestError naming the part: missing file, not an image, bad base64)."""
        out = []
        for part in parts:
            loaded = self._loaded.get(part.url)
            if loaded is None:
                processor = self.processor(part.where)
                try:
                    image = load_image(part.url)
                except ImageError as err:
                    raise RequestError(f"{part.where}: {err}", part.where) from None
                grid = processor.image_processor(images=[image], return_tensors="np")["image_grid_thw"]
                key = hashlib.sha256(repr(image.size).encode() + image.tobytes()).hexdigest()
                loaded = self._loaded[part.url] = LoadedImage(
                    part.url, key, image, tokens_per_image(processor, np.asarray(grid))[0], image_data_uri(image))
            out.append(loaded)
        return tuple(out)

    def expand(self, ids: list[int], images: Sequence[LoadedImage]) -> list[int]:
        return expand_image_pads(ids, self.pad, [image.tokens for image in images])

    def engine_prompt(self, prompt_ids: list[int], images: Sequence[LoadedImage]) -> EnginePrompt:
        """What /generate gets: the ids with one pad per image, and every image of the conversation."""
        try:
            ids = collapse_image_pads(prompt_ids, self.pad, [image.tokens for image in images])
        except ValueError as err:
            raise RequestError(f"messages: {err}", "messages") from None
        return EnginePrompt(ids, [image.data_uri for image in images], self.pad)

    def fill_train_inputs(self, sample: Sample) -> None:
        """The sample's multimodal_train_inputs: the image processor's outputs for its images, in order."""
        if sample.multimodal_inputs is None:
            sample.multimodal_train_inputs = None
            return
        images = [self._loaded[ref].image for ref in sample.multimodal_inputs["images"]]
        sample.multimodal_train_inputs = train_inputs(self._processor, images)
