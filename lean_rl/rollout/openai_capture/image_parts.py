"""Image content parts of a chat request (pure parsing, no I/O): OpenAI's
`{"type": "image_url", "image_url": {"url": URL, "detail": ...}}` in a user message, where URL is a
`data:` URL (base64), a `file://` URL or a local path. Each becomes `{"type": "image"}`, the part a
vision-language chat template renders as its image tokens; the URLs are returned in order with the
field each came from, for the errors. Remote URLs are refused: nothing in lean_rl fetches images
(buffer/images.py reads local ones only), so an agent sends the bytes (a data: URL) or a path.
`detail` is accepted and ignored: the model's processor decides the resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lean_rl.rollout.openai_capture.chat import RequestError


@dataclass(frozen=True)
class ImagePart:
    where: str  # the request field, e.g. messages[2].content[1].image_url.url
    url: str


def take_image_parts(messages: list[dict]) -> tuple[list[dict], list[ImagePart]]:
    """`messages` with each image_url part made {"type": "image"} (messages without one are the same
    objects), and the images in order. RequestError naming the part for a malformed or remote one."""
    out: list[dict] = []
    images: list[ImagePart] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_image_part(p) for p in content):
            out.append(message)
            continue
        if message.get("role") != "user":
            raise RequestError(f"messages[{i}].content: image_url parts are taken in user messages only, "
                               f"not in a {message.get('role')!r} message", f"messages[{i}].content")
        parts = []
        for j, part in enumerate(content):
            if _is_image_part(part):
                where = f"messages[{i}].content[{j}]"
                images.append(ImagePart(f"{where}.image_url.url", _url(part, where)))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, images


def _is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def _url(part: dict, where: str) -> str:
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else None
    if not isinstance(url, str) or not url:
        raise RequestError(f'{where}.image_url: expected {{"url": "data:image/png;base64,..." or a local path}}',
                           f"{where}.image_url")
    scheme = url.split(":", 1)[0].lower() if "://" in url[:16] else ""
    if scheme and scheme != "file":
        raise RequestError(f"{where}.image_url.url: {url[:60]!r}: remote image URLs are not fetched; send the image "
                           "as a data: URL (base64) or a local file path", f"{where}.image_url.url")
    return url
