"""A hook given as a Python function rather than a dotted path (lean_rl/api.py). It is a `str`, the
function's own dotted name, so a config field declared `str` (a --*-path flag) holds it unchanged:
flags' derive steps and checks see a given path, messages name the function, and `import_object`
(utils/plugins.py) returns the function instead of importing the name. Pickled, it carries the
function by value (cloudpickle): a lambda or a function defined in `__main__` or a notebook reaches the
trainer's Ray actors and spawned processes, which could not import it by name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_NAMES: dict[str, Callable[..., Any]] = {}  # name -> the function first given under it, in this process
_LOCK = threading.Lock()


class PythonHook(str):
    function: Callable[..., Any]

    def __new__(cls, name: str, function: Callable[..., Any]) -> PythonHook:
        hook = super().__new__(cls, name)
        hook.function = function
        return hook

    def __reduce__(self) -> tuple[Any, ...]:
        from ray import cloudpickle  # by value where pickle would look the function up by name

        return _restore, (str(self), cloudpickle.dumps(self.function))


def _restore(name: str, pickled: bytes) -> PythonHook:
    from ray import cloudpickle

    return PythonHook(name, cloudpickle.loads(pickled))


def python_hook(function: Callable[..., Any]) -> PythonHook:
    """`function` as a hook value. Its name is `module.qualname`; a different function that already took
    that name in this process (a cell run again, two lambdas) gets `#2`, `#3`, ... so that the caches
    keyed by a hook's name (algorithms/hooks.py) never return an older function."""
    target = getattr(function, "func", function)  # functools.partial: named after the wrapped function
    base = f"{getattr(target, '__module__', None) or '?'}.{getattr(target, '__qualname__', type(target).__name__)}"
    with _LOCK:
        name, n = base, 1
        while name in _NAMES and _NAMES[name] != function:  # == : a bound method is a new object each time
            n += 1
            name = f"{base}#{n}"
        _NAMES[name] = function
    return PythonHook(name, function)
