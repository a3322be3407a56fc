"""What a capture session (session.py) knows of its own tokens, to keep an agent's trajectory one Sample:
an agent sends its history back as text, and re-tokenizing the model's own output rarely reproduces
the ids it sampled. So (1) an assistant message this session answered is rendered from the exact text
of its sampled ids, and (2) a prompt whose text starts with an earlier call's prompt + output reuses
that call's ids (trajectory.splice_prompt_ids). Also the sampling params of one call: the session's,
with the request's own on top.

Images (image_url parts, image_tokens.py): the text holds one pad per image, the prompt ids the
processor's expansion; a call's tip is kept as the text of its ids with the runs collapsed (what the
next rendering writes) and its images' keys, so a later prompt reuses its ids only when it shows the
same pictures in the same places."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jinja2

from lean_rl.rollout.openai_capture.chat import ChatRequest, RequestError, as_sampled, message_signature
from lean_rl.rollout.openai_capture.image_parts import take_image_parts
from lean_rl.rollout.openai_capture.image_tokens import LoadedImage, SessionImages
from lean_rl.rollout.openai_capture.trajectory import splice_prompt_ids
from lean_rl.rollout.tool_calls import render_chat
from lean_rl.rollout.vision import EnginePrompt


@dataclass(frozen=True)
class RenderedChat:
    """A request's prompt text (one image pad per image) and its images in order."""

    text: str
    images: tuple[LoadedImage, ...] = ()

    @property
    def image_keys(self) -> tuple[str, ...]:
        return tuple(image.key for image in self.images)

    @property
    def image_refs(self) -> tuple[str, ...]:
        return tuple(image.ref for image in self.images)


class SessionTokens:
    def __init__(self, tokenizer: Any, model_path: str):
        self.tokenizer = tokenizer
        self.images = SessionImages(model_path)
        # (text, ids, image keys) of each call's prompt + output
        self._tips: list[tuple[str, list[int], tuple[str, ...]]] = []
        self._history_text: dict[tuple, str] = {}  # message_signature -> the exact text of its sampled ids

    def render(self, request: ChatRequest) -> RenderedChat:
        """The prompt of a chat request (RequestError where a part or the chat template refuses it)."""
        messages, parts = take_image_parts([as_sampled(m, self._history_text) for m in request.messages])
        images = self.images.load(parts)
        try:
            text = render_chat(self.tokenizer, messages, request.tools, add_generation_prompt=True)
        except ValueError as err:
            raise RequestError(str(err), str(err).split(":", 1)[0]) from None
        except jinja2.TemplateError as err:  # e.g. a template that refuses the order of the roles
            raise RequestError(f"the model's chat template refused the messages: {err}", "messages") from None
        return RenderedChat(text, images)

    def prompt_ids(self, chat: RenderedChat) -> list[int]:
        if not chat.images:
            return splice_prompt_ids(chat.text, self._tips, lambda rest, _: self.encode(rest))
        return splice_prompt_ids(chat.text, self._tips,
                                 lambda rest, skip: self.images.expand(self.encode(rest), chat.images[skip:]),
                                 chat.image_keys)

    def engine_prompt(self, prompt_ids: list[int], chat: RenderedChat) -> EnginePrompt:
        return self.images.engine_prompt(prompt_ids, chat.images) if chat.images else EnginePrompt(prompt_ids)

    def text_after(self, prompt_ids: list[int], output_ids: list[int]) -> str:
        """The text the output adds to the prompt (decoded together: a tokenizer may decode a leading
        space differently at the start of a sequence)."""
        prompt_text = self.decode(prompt_ids)
        full = self.decode(prompt_ids + output_ids)
        return full[len(prompt_text):] if full.startswith(prompt_text) else self.decode(output_ids)

    def remember(self, prompt: EnginePrompt, prompt_ids: list[int], output_ids: list[int], message: dict,
                 history_text: str, chat: RenderedChat) -> None:
        """A recorded call: its prompt + output, for later prompts to extend (the text of the engine's ids:
        one pad per image, as the template writes it), and the exact text of the assistant message it
        answered, for when the agent sends that message back."""
        self._tips.append((self.decode(prompt.input_ids + output_ids), prompt_ids + output_ids, chat.image_keys))
        signature = message_signature(message)
        assert signature is not None  # completion_from_output answers with an assistant message
        self._history_text[signature] = history_text

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def call_sampling_params(session_params: dict, request: ChatRequest, left: int) -> dict:
    """One call's sampling params: the session's, with the request's max_tokens (at most `left`, the
    response budget left), temperature, top_p and stop on top."""
    params = dict(session_params)
    params["max_new_tokens"] = min(request.max_tokens or left, left)
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.top_p is not None:
        params["top_p"] = request.top_p
    if request.stop:
        params["stop"] = list(dict.fromkeys([*params.get("stop", ()), *request.stop]))
    params.setdefault("temperature", 1.0)
    params.setdefault("top_p", 1.0)
    return params
