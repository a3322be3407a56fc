"""What the compatibility modules know of the run they serve: its Config (the router, the engines, the
API key, for http_utils.post and the `args` view), and the /generate answers that the current call
of a user's generate function received (their per-token policy versions: convert.py fills a slime
sample's versions from them, exactly)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

_BOUND: list = []  # [the run's Config], set once the run loads its hooks


def bind_run(cfg: Config) -> None:
    """Make `cfg` the run the compatibility modules serve (extensions.load_extensions)."""
    _BOUND[:] = [cfg]


def bound_config() -> Config:
    if not _BOUND:
        raise RuntimeError("lean_rl's slime compatibility modules serve a lean_rl run: they are bound to it when "
                           "the run loads its hooks (lean_rl.extensions.install(cfg) outside a run)")
    return _BOUND[0]


@dataclass(frozen=True)
class GenerateAnswer:
    """One /generate answer seen by http_utils.post: the ids it generated and each one's policy version."""

    output_ids: list[int]
    versions: list[int]
    aborted: bool
    relayed: bool = False  # seen by the router gateway (router_gateway.py): maybe another call's answer


# Set per call of a user's generate function (hooks.py); the tasks it starts share the same list
_ANSWERS: contextvars.ContextVar[list[GenerateAnswer] | None] = contextvars.ContextVar("slime_generate_answers",
                                                                                      default=None)


def start_recording() -> list[GenerateAnswer]:
    """A fresh record for the generate call running in this task (and the tasks it starts)."""
    answers: list[GenerateAnswer] = []
    _ANSWERS.set(answers)
    return answers


_RUNNING: dict[int, list[GenerateAnswer]] = {}  # the records of the slime calls running now, in any thread
_RUNNING_LOCK = threading.Lock()


@contextlib.contextmanager
def recording() -> Iterator[list[GenerateAnswer]]:
    """start_recording() for the duration of one slime call, which also receives the answers the router
    gateway relays meanwhile (a foreign client's requests carry nothing that names their call: each
    running call gets them all, and convert.py matches answers to a sample's tokens)."""
    answers = start_recording()
    with _RUNNING_LOCK:
        _RUNNING[id(answers)] = answers
    try:
        yield answers
    finally:
        with _RUNNING_LOCK:
            _RUNNING.pop(id(answers), None)


def record_relayed_answer(answer: GenerateAnswer) -> None:
    with _RUNNING_LOCK:
        for answers in _RUNNING.values():
            answers.append(answer)


def record_answer(answer: GenerateAnswer) -> None:
    answers = _ANSWERS.get()
    if answers is not None:  # outside a generate call (a rollout function's own requests): nothing to attribute
        answers.append(answer)
