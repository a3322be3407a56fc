"""The environment interface of multi-turn rollouts (`--environment-path`), and how an observation
becomes token ids.

    class MyEnv:                                    # any object with these methods
        async def reset(self, sample) -> Observation | str | list[int] | None
        async def step(self, action: str) -> StepResult | tuple[observation, reward, done]
        async def close(self) -> None               # optional

    def make_env(cfg, sample) -> MyEnv              # --environment-path my_pkg.envs.make_env

`reset` sees the prompt's Sample (label, metadata) before the first turn; what it returns goes at the
start of the response, not trained on (None: start from the prompt as it is). `step` gets the text of
the model's turn and answers with the next observation, a reward (float or None) and whether the
episode is over. An observation is text (rendered as a chat message of its role with the model's chat
template under --apply-chat-template, plain text otherwise) or token ids (appended as they are).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

from lean_rl.sample import Sample


@dataclass(frozen=True)
class Observation:
    """What the environment shows the model next: `text` (as a `role` message) or raw `token_ids`."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    role: str = "user"

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("Observation: give exactly one of text and token_ids")


@dataclass(frozen=True)
class StepResult:
    observation: Observation | str | list[int] | None
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] | None = None  # kept in the sample's metadata["turns"]


class Environment(Protocol):
    async def reset(self, sample: Sample) -> Observation | str | list[int] | None: ...

    async def step(self, action: str) -> StepResult | tuple: ...


class EnvironmentFactory(Protocol):
    """--environment-path: a plain `def` (a class works too) called once per trajectory."""

    def __call__(self, cfg: Any, sample: Sample, /) -> Environment: ...


def as_observation(value: Any, what: str) -> Observation | None:
    """An environment's observation in its accepted forms; TypeError naming `what` otherwise."""
    if value is None or isinstance(value, Observation):
        return value
    if isinstance(value, str):
        return Observation(text=value)
    if isinstance(value, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return Observation(token_ids=tuple(value))
    raise TypeError(f"{what} returned {type(value).__name__} {str(value)[:80]!r} as observation; expected "
                    "an Observation, text, a list of token ids or None")


def as_step_result(value: Any) -> StepResult:
    """`step`'s answer: a StepResult or a tuple (observation, reward, done[, info])."""
    if isinstance(value, tuple) and len(value) in (3, 4):
        value = StepResult(*value)
    if not isinstance(value, StepResult):
        raise TypeError(f"step returned {type(value).__name__} {str(value)[:80]!r}; expected a StepResult or "
                        "a tuple (observation, reward, done)")
    if value.reward is not None and (isinstance(value.reward, bool) or not isinstance(value.reward, (int, float))):
        raise TypeError(f"step returned reward {value.reward!r}; expected a number or None")
    return StepResult(as_observation(value.observation, "step"), value.reward, bool(value.done), value.info)


class ObservationRenderer:
    """Observation -> token ids. Earlier turns are never re-tokenized: only the new observation is, so
    the ids of turn k+1's prompt are exactly those of turns <= k plus these.

    With a chat template, a text observation after a model turn becomes what the template puts between
    the end of an assistant message and the next assistant turn: rendered once around a marker,
    `[user "?", assistant MARK, role text]` + generation prompt, everything after MARK. That starts
    with the template's end of the assistant message; when the model's turn already ended with that
    text (it stopped on the end-of-turn token) it is not repeated, when it stopped otherwise (a stop
    string, the per-turn cap) it is kept, so the context stays what the template would have made.
    reset's observation comes before the first model turn: a `role` message inserted before the
    prompt's generation prompt."""

    _MARK = "\x00lean_rl-turn-end\x00"

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat

    def ids(self, observation: Observation, turn_end: str = "") -> tuple[list[int], str]:
        """(token ids, their text) of `observation` after a model turn; `turn_end`: the text of the
        token that ended that turn ("" when the turn did not end on a stop token)."""
        if observation.token_ids is not None:
            return list(observation.token_ids), self.tokenizer.decode(list(observation.token_ids))
        text = observation.text
        if self.chat:
            suffix = self._after_assistant(observation.role)
            if turn_end and suffix.startswith(turn_end):
                suffix = suffix[len(turn_end):]
            text = suffix.replace(self._MARK, observation.text)
        return self.tokenizer.encode(text, add_special_tokens=False), text

    def prompt_with(self, prompt_ids: list[int], observation: Observation) -> list[int]:
        """The prompt with reset's observation: appended (token ids, plain text) or, with a chat
        template, a message inserted before the generation prompt that ends the prompt."""
        if observation.token_ids is not None:
            return prompt_ids + list(observation.token_ids)
        if not self.chat:
            return prompt_ids + self.tokenizer.encode(observation.text, add_special_tokens=False)
        message, generation_prompt = self._before_generation(observation.role)
        tail = self.tokenizer.encode(generation_prompt, add_special_tokens=False)
        if not tail or prompt_ids[-len(tail):] != tail:
            raise ValueError(f"the prompt does not end with the chat template's generation prompt "
                             f"{generation_prompt!r}: reset cannot insert a {observation.role!r} message")
        inserted = self.tokenizer.encode(message.replace(self._MARK, observation.text), add_special_tokens=False)
        return prompt_ids[:-len(tail)] + inserted + tail

    @functools.lru_cache(maxsize=8)
    def _after_assistant(self, role: str) -> str:
        """The template's text after an assistant message, with a `role` message whose content is the
        marker, up to the next assistant turn."""
        rendered = self._render([{"role": "user", "content": "?"}, {"role": "assistant", "content": self._MARK},
                                 {"role": role, "content": self._MARK}], True)
        if rendered.count(self._MARK) != 2:
            raise ValueError(f"the chat template does not render a {role!r} message after an assistant message "
                             "as text: give observations as token ids, or another role")
        return rendered[rendered.find(self._MARK) + len(self._MARK):]

    @functools.lru_cache(maxsize=8)
    def _before_generation(self, role: str) -> tuple[str, str]:
        """(a `role` message's text after a user message, the generation prompt), from renders of
        [user], [user, role MARK] and [user] + generation prompt."""
        user = [{"role": "user", "content": "?"}]
        plain, with_message = self._render(user, False), self._render(user + [{"role": role, "content": self._MARK}], False)
        generation = self._render(user, True)
        if not (with_message.startswith(plain) and generation.startswith(plain)) or self._MARK not in with_message:
            raise ValueError(f"the chat template does not render a {role!r} message after a user message as text")
        return with_message[len(plain):], generation[len(plain):]

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
