"""Image prompts (--multimodal-keys): read a row's images, put them in its chat, render it with the HF processor.

slime's meaning of the flag: a JSON object {media type: column}, e.g. '{"image": "images"}'; the column
holds a list of images (one image alone is taken as a list of one), and each `<image>` in the text of
a message is replaced by the next image, in order. lean_rl takes the type "image" (video and audio are
refused), and a row whose text has no `<image>` at all gets its images before the first user message's
text. An image is a local path, a file:// URL, a data: URL or bare base64 of the file's bytes.

Every image is decoded once here and converted to RGB; what SGLang receives is that RGB image re-encoded
as PNG (image_data_uri), so the engine and the trainer's processor see the same pixels whatever the
source format (a JPEG decoded by two libraries, or an RGBA PNG, could differ otherwise).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

from lean_rl.options import ConfigError

IMAGE_PLACEHOLDER = "<image>"
SUPPORTED_TYPES = ("image",)
FLAG = "--multimodal-keys"
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


class ImageError(ValueError):
    pass


def check_multimodal_keys(value: str | None) -> str | None:
    """--multimodal-keys as given, once checked: a JSON object {"image": COLUMN}."""
    if value is None or value == "":
        return None
    try:
        keys = json.loads(value)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{FLAG}: not JSON ({err.msg} at column {err.colno}); "
                          "e.g. '{\"image\": \"images\"}'") from None
    if not isinstance(keys, dict) or not keys or not all(isinstance(v, str) and v for v in keys.values()):
        raise ConfigError(f"{FLAG}: must be a JSON object of media type -> column, e.g. '{{\"image\": \"images\"}}', "
                         f"got {value!r}")
    unsupported = sorted(set(keys) - set(SUPPORTED_TYPES))
    if unsupported:
        raise ConfigError(f"{FLAG}: media type(s) {unsupported} are not supported; "
                          f"lean_rl takes {list(SUPPORTED_TYPES)}")
    return value


def image_column(value: str | None) -> str | None:
    """The row column that holds the images (--multimodal-keys' "image"), or None."""
    return json.loads(value)["image"] if value else None


@functools.lru_cache(maxsize=4)
def load_processor(path: str):
    import transformers

    return transformers.AutoProcessor.from_pretrained(path)


def processor_for(data, model_path: str):
    """The checkpoint's processor when the prompts hold images (`data`: the DataConfig), else None."""
    return load_processor(model_path) if data.multimodal_keys else None


def load_image(ref: Any):
    """A PIL RGB image from a path, file:// URL, data: URL or bare base64 (ImageError saying what is wrong)."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(ref, str) or not ref:
        raise ImageError(f"an image must be a path, file:// URL or base64 text, got {str(ref)[:60]!r}")
    try:
        raw = _image_bytes(ref)
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (OSError, UnidentifiedImageError, ValueError) as err:
        raise ImageError(f"{_shown(ref)}: {_reason(err)}") from None
    return image.convert("RGB")


def _image_bytes(ref: str) -> bytes:
    if ref.startswith("data:"):
        header, _, data = ref.partition(",")
        if not header.endswith(";base64"):
            raise ValueError("a data: URL must be base64 (data:image/png;base64,...)")
        return base64.b64decode(data, validate=True)
    if ref.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(ref).path)).read_bytes()
    if "://" in ref:
        raise ValueError("only local images are read (a path or file:// URL); download remote ones first")
    if len(ref) < 4096 and Path(ref).is_file():
        return Path(ref).read_bytes()
    if len(ref) >= 64 and len(ref) % 4 == 0 and _BASE64.fullmatch(ref):
        return base64.b64decode(ref, validate=True)
    raise FileNotFoundError(ref)


def _shown(ref: str) -> str:
    return repr(ref if len(ref) <= 80 else ref[:40] + "...")


def _reason(err: Exception) -> str:
    if isinstance(err, FileNotFoundError):
        return "no such file"
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__


def image_data_uri(image) -> str:
    """What SGLang's image_data takes: the RGB image as a PNG data URL."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def row_images(row: dict, column: str) -> list[str]:
    """The row's image references (BadRow-style ValueError naming the column)."""
    if column not in row:
        raise ImageError(f"missing key {column!r} ({FLAG}); keys: {sorted(row)}")
    value = row[column]
    if hasattr(value, "tolist"):  # a parquet list column read as an array
        value = value.tolist()
    images = [value] if isinstance(value, str) else value
    if not isinstance(images, list) or not images:
        raise ImageError(f"{column!r} ({FLAG}) must be an image or a non-empty list of images, got {str(value)[:60]!r}")
    return images


def with_image_parts(prompt: str | list[dict[str, Any]], n_images: int, column: str) -> list[dict[str, Any]]:
    """The chat with each `<image>` made an image content part (or the images before the first user text)."""
    messages: list[dict[str, Any]] = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                                      else [dict(m) for m in prompt])
    placed = 0
    for message in messages:
        if isinstance(message["content"], str) and IMAGE_PLACEHOLDER in message["content"]:
            parts: list[dict[str, Any]] = []
            for segment in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", message["content"]):
                if segment == IMAGE_PLACEHOLDER:
                    parts.append({"type": "image"})
                    placed += 1
                elif segment:
                    parts.append({"type": "text", "text": segment})
            message["content"] = parts
    if placed == 0:
        first_user = next((m for m in messages if m["role"] == "user"), None)
        if first_user is None:
            raise ImageError(f"the prompt has no user message to put the {column!r} images in")
        text = first_user["content"]
        text_parts = [{"type": "text", "text": text}] if isinstance(text, str) else list(text)
        first_user["content"] = [{"type": "image"}] * n_images + text_parts
    elif placed != n_images:
        raise ImageError(f"the prompt has {placed} {IMAGE_PLACEHOLDER} but {column!r} ({FLAG}) holds {n_images} images")
    return messages


def render_image_prompt(prompt, refs: list[str], column: str, processor, tools=None) -> list[int]:
    """The prompt's token ids as the processor expands them (one image pad per vision token)."""
    images = []
    for i, ref in enumerate(refs):
        try:
            images.append(load_image(ref))
        except ImageError as err:
            raise ImageError(f"{column!r} ({FLAG}) image {i}: {err}") from None
    messages = with_image_parts(prompt, len(images), column)
    text = processor.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=images, return_tensors="np")
    return [int(t) for t in out["input_ids"][0]]
