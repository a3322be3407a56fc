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
    """Observation -> the token ids appended after the model's turn. Earlier turns are never
    re-tokenized: only the new observation is, so the ids of turn k+1's prompt are exactly those of
    turns <= k plus these.

    With a chat template, a text observation becomes what the template puts between the end of an
    assistant message and the next assistant turn: rendered once around a marker,
    `[user "?", assistant MARK, role text]` + generation prompt, everything after MARK. That starts
    with the template's end of the assistant message; when the model already ended its turn with the
    end-of-turn token (eos) that part is dropped, when it stopped otherwise (a stop string, the
    per-turn cap) it is kept, so the context stays what the template would have made."""

    _MARK = "\x00lean_rl-turn-end\x00"

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat
        self.eos_text = tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else ""

    def ids(self, observation: Observation, model_ended_turn: bool) -> tuple[list[int], str]:
        """(token ids, their text) of `observation` after a model turn; `model_ended_turn`: that turn's
        last token was the eos."""
        if observation.token_ids is not None:
            return list(observation.token_ids), self.tokenizer.decode(list(observation.token_ids))
        text = observation.text
        if self.chat:
            suffix = self._chat_suffix(observation.role)
            if model_ended_turn and self.eos_text and suffix.startswith(self.eos_text):
                suffix = suffix[len(self.eos_text):]
            text = suffix.replace(self._MARK, observation.text)
        return self.tokenizer.encode(text, add_special_tokens=False), text

    @functools.lru_cache(maxsize=8)
    def _chat_suffix(self, role: str) -> str:
        """The template's text after an assistant message, with a `role` message whose content is the
        marker, up to the next assistant turn."""
        messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": self._MARK},
                    {"role": role, "content": self._MARK}]
        rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        first = rendered.find(self._MARK)
        if first < 0 or rendered.count(self._MARK) != 2:
            raise ValueError(f"the chat template does not render a {role!r} message after an assistant message "
                             "as text: give observations as token ids, or another role")
        return rendered[first + len(self._MARK):]
