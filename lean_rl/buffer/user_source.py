"""--data-source-path: the user's source of training prompts in place of the --prompt-data reader.

The flag names a factory, `make_source(cfg) -> source` (a class whose constructor takes cfg is one),
called once when the buffer is built. The source answers the three calls the DataBuffer makes of the
built-in PromptSource (prompt_source.PromptSourceLike): next() -> (epoch, PromptRecord) | None,
state_dict() -> a JSON-serialisable dict, load_state_dict(state). The buffer saves state_dict() with
every checkpoint and a resume calls load_state_dict() before the first next(): a source that restores
its cursor there neither repeats nor skips a prompt across a resume (the buffer itself keeps the
groups in flight, ready or pending). UserSource checks every answer and names the flag when one is
wrong, so a mistake stops the run where it happens, not later in the trainer."""

from __future__ import annotations

import json
from typing import Any

from lean_rl.buffer.prompt_source import PromptRecord
from lean_rl.utils.plugins import PluginError, describe, dotted_name, hook_return_error, load_function

FLAG = "--data-source-path"
METHODS = ("next", "state_dict", "load_state_dict")


def load_source_factory(path: str):
    """Import and check the factory (start-up: lean_rl/extensions.py load_extensions, and create_data_buffer)."""
    return load_function(path, FLAG, num_args=1, must_be_sync=True)


def make_user_source(cfg, factory=None) -> "UserSource":
    """The source `factory` (the run's loaded hook, see lean_rl/extensions.py; imported here when None) makes."""
    path = cfg.data.data_source_path
    factory = factory or load_source_factory(path)
    source = factory(cfg)
    missing = [name for name in METHODS if not callable(getattr(source, name, None))]
    if missing:
        raise PluginError(f"{FLAG} {path!r}: {dotted_name(factory)}(cfg) returned {describe(source)}, which has no "
                          f"{', '.join(m + '()' for m in missing)}; a prompt source needs next(), state_dict() and "
                          "load_state_dict(state) (docs/extending.md)")
    return UserSource(source, path)


class UserSource:
    """The user's source, each answer checked (a wrong type is a HookReturnError naming the flag)."""

    def __init__(self, source, path: str):
        self.source, self.path = source, path

    @property
    def _flag(self) -> str:
        return f"{FLAG} {self.path}"

    def next(self) -> tuple[int, PromptRecord] | None:
        item = self.source.next()
        if item is None:
            return None
        expected = "None (no prompt left) or a pair (epoch: int, lean_rl.buffer.prompt_source.PromptRecord)"
        if not (isinstance(item, tuple) and len(item) == 2 and _is_int(item[0]) and isinstance(item[1], PromptRecord)):
            raise hook_return_error(f"{self._flag} next()", self.source.next, item, expected)
        record = item[1]
        tokens = record.tokens
        problem = None
        if not _is_int(record.row):
            problem = f"its row must be an int (the prompt's stable id), got {describe(record.row)}"
        elif not isinstance(tokens, (list, tuple)) or not tokens or not all(_is_int(t) for t in tokens):
            problem = "its tokens must be a non-empty list of token ids (lean_rl.buffer.prompt_source.render_prompt)"
        elif not isinstance(record.metadata, dict):
            problem = f"its metadata must be a dict, got {describe(record.metadata)}"
        elif not isinstance(record.prompt, (str, list)):
            problem = f"its prompt must be text or a list of chat messages, got {describe(record.prompt)}"
        else:
            try:  # every sample is saved with the checkpoint: a field JSON cannot hold would break resume
                json.dumps([record.prompt, record.label, record.metadata])
            except (TypeError, ValueError) as err:
                problem = f"its prompt, label and metadata must be JSON-serialisable ({err})"
        if problem:
            raise hook_return_error(f"{self._flag} next()", self.source.next, item, f"{expected}; {problem}")
        return item

    def state_dict(self) -> dict[str, Any]:
        state = self.source.state_dict()
        expected = "a JSON-serialisable dict (it is saved with the checkpoint)"
        if not isinstance(state, dict):
            raise hook_return_error(f"{self._flag} state_dict()", self.source.state_dict, state, expected)
        try:
            json.dumps(state)
        except (TypeError, ValueError) as err:
            raise hook_return_error(f"{self._flag} state_dict()", self.source.state_dict, state,
                                    f"{expected}; {err}") from None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
