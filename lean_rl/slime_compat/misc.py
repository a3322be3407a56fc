"""slime.utils.misc: load_function and SingletonMeta, as slime's functions use them."""

from __future__ import annotations

import functools
import importlib

from lean_rl.utils.python_hooks import PythonHook


@functools.cache
def load_function(path: str):
    """The object at dotted `path` ("package.module.name"), imported once; a function given in Python
    (lean_rl/api.py) as it is."""
    if isinstance(path, PythonHook):
        return path.function
    module_name, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


class SingletonMeta(type):
    """One instance per class: later constructions return the first (their arguments are ignored)."""

    _instances: dict = {}

    def __call__(cls, *args, **kwargs):
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]

    def clear_instances(cls) -> None:
        cls._instances = {}
