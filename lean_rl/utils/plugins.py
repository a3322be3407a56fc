"""Load user extension points given by dotted path, and check them at start-up, not mid-run."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any, Callable

from lean_rl.options import ConfigError
from lean_rl.utils.python_hooks import PythonHook
from lean_rl.utils.slime_finder import COMPAT_PREFIX, install_slime_finder


class PluginError(ConfigError):
    """A dotted path that does not load, or a function of the wrong shape: the user's flag to fix."""


def import_object(path: str, flag: str) -> Any:
    """What the dotted path `pkg.module.attr` names, imported; a PluginError naming `flag` when it cannot be.
    A function given in Python (lean_rl/api.py) is returned as it is."""
    if isinstance(path, PythonHook):
        return path.function
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PluginError(f"{flag} {path!r}: expected a dotted path 'package.module.function'")
    install_slime_finder()  # a hook written for slime imports slime.*: served by lean_rl unless slime is installed
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise PluginError(f"{flag} {path!r}: cannot import module {module_name!r} ({err})") from err
    except Exception as err:  # the user's module raised while importing: say where
        raise PluginError(f"{flag} {path!r}: importing {module_name!r} raised {type(err).__name__}: {err}") from err
    if not hasattr(module, attr):
        raise PluginError(f"{flag} {path!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def load_function(
    path: str,
    flag: str,
    num_args: int | tuple[int, ...],
    must_be_async: bool = False,
    must_be_sync: bool = False,
    keywords: tuple[str, ...] = (),
) -> Callable[..., Any]:
    """Import `pkg.module.attr` and check that it can be called with `num_args` positional arguments
    (a tuple: with any one of those counts, e.g. (3, 4) for a generate function that may take
    `evaluation`), plus the keyword arguments `keywords` (passed by name, e.g. a loss's inputs).
    A class is a callable too: its constructor's parameters are checked.

    `flag` names the command-line flag in every error, so a typo is reported as the user typed it.
    """
    fn = import_object(path, flag)
    attr = path.rpartition(".")[2]
    if not callable(fn):
        raise PluginError(f"{flag} {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    if must_be_async and not is_async:
        raise PluginError(f"{flag} {path!r}: must be an `async def` function")
    if must_be_sync and is_async:
        raise PluginError(f"{flag} {path!r}: must be a plain `def` function, not `async def`")
    counts = (num_args,) if isinstance(num_args, int) else tuple(num_args)
    try:
        signature = inspect.signature(fn)
    except ValueError:
        return fn  # builtins without an inspectable signature: trust them
    errors = []
    for count in counts:
        try:
            signature.bind(*([None] * count), **{name: None for name in keywords})
            return fn
        except TypeError as err:
            errors.append(err)
    wanted = " or ".join(str(c) for c in counts)
    named = f" and the keyword argument(s) {', '.join(keywords)}" if keywords else ""
    raise PluginError(
        f"{flag} {path!r}: must accept {wanted} positional argument(s){named}; "
        f"its signature is {attr}{signature} ({errors[0]})"
    ) from errors[0]


def accepts_positional(fn: Callable[..., Any], count: int) -> bool:
    """Whether `fn` can be called with `count` positional arguments (True when not inspectable)."""
    try:
        inspect.signature(fn).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def keyword_only(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` has a keyword-only parameter `name` (e.g. `def f(a, b, *, evaluation=False)`)."""
    try:
        parameter = inspect.signature(fn).parameters.get(name)
    except ValueError:
        return False
    return parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY


class HookReturnError(TypeError):
    """A user hook returned something of the wrong type: a programming error, not a per-sample failure,
    so it stops the run (never counted as a FAILED sample); the message names the flag, the function
    and what it returned."""


def dotted_name(fn: Callable[..., Any]) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def describe(value: Any, limit: int = 120) -> str:
    """`value` as an error message shows it: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:limit]}{'...' if len(text) > limit else ''}"


def hook_return_error(flag: str, fn: Callable[..., Any], value: Any, expected: str) -> HookReturnError:
    return HookReturnError(f"{flag} ({dotted_name(fn)}) returned {describe(value)}; it must return {expected} "
                           "(docs/extending.md)")




def is_slime_function(fn) -> bool:
    """Whether `fn` was written against slime's API: its module imported something of slime's."""
    fn = inspect.unwrap(getattr(fn, "func", fn))
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None:
        return False
    if module.__name__.startswith(COMPAT_PREFIX + "."):
        return True  # ours, served as slime.* (rm_hub, filter_hub)
    for value in vars(module).values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and (name == "slime" or name.startswith(("slime.", COMPAT_PREFIX + "."))):
            return True
    return False
