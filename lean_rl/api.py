"""lean_rl as a library: the run's configuration built from keyword arguments, hooks given as Python
functions, the loop run in this process and its metrics returned.

    from lean_rl import api

    async def reward(cfg, sample):                  # the --custom-rm-path contract (docs/extending.md)
        return float(sample.response.isdigit())

    cfg = api.build_config(hf_checkpoint="model", prompt_data="train.jsonl", input_key="prompt",
                           custom_rm_path=reward, rollout_batch_size=8, n_samples_per_prompt=8)
    steps = api.train(cfg)                          # [{"step": 0, "rollout/reward_mean": ...}, ...]

Every flag `--some-flag` is the keyword `some_flag` (`no_tensorboard=True` for --no-tensorboard;
`sglang_*` / `router_*` pass through to the servers as on the command line). There is no second list of
options: the keywords are turned into the command line (`command_line`) that `config.parse_config`
reads, so a keyword run and the equivalent flags build the same Config, checks and derived values
included. A flag that names a hook by dotted path (HOOK_FLAGS) also takes the function itself; it
travels to Ray actors and spawned processes by value (utils/python_hooks.py), lambdas included.
docs/python_api.md has the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lean_rl.config import Config, build_parser, parse_config
from lean_rl.options import ConfigError
from lean_rl.run_loop import run
from lean_rl.runtime import Runtime
from lean_rl.utils.python_hooks import PythonHook, python_hook

# the flags loaded with utils/plugins.load_function (lean_rl/extensions.py and the modules it names):
# these take a Python function as well as a dotted path
HOOK_FLAGS = (
    "--rollout-function-path", "--eval-function-path", "--custom-generate-function-path",
    "--rollout-sample-hook-path", "--custom-rm-path", "--dynamic-sampling-filter-path",
    "--rollout-sample-filter-path", "--rollout-all-samples-process-path", "--custom-reward-post-process-path",
    "--data-source-path", "--custom-advantage-function-path", "--custom-loss-function-path",
    "--custom-tis-function-path",
)
PASSTHROUGH_PREFIXES = ("sglang_", "router_")  # config.py: passed to the SGLang servers / the router


def command_line(**flags: Any) -> list[Any]:
    """The command line that `flags` stand for (a hook given as a function is a PythonHook, a `str`).
    A value of None leaves the flag out (its default); False leaves a switch out."""
    parser = build_parser()
    argv: list[Any] = []
    for name, value in flags.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        action = parser._option_string_actions.get(flag)
        if action is None:
            if not name.startswith(PASSTHROUGH_PREFIXES):
                raise ConfigError(f"{name}: no such option (no flag {flag}){_close_match(name, parser)}")
            argv += _passthrough_tokens(name, flag, value)
        else:
            argv += _tokens(name, flag, action, value)
    return argv


def build_config(**flags: Any) -> Config:
    """The run's Config from keyword arguments, as `python -m lean_rl.train` builds it from flags."""
    return parse_config(command_line(**flags))


def train(cfg: Config) -> list[dict[str, float]]:
    """Run `cfg`'s loop here (the synchronous loop of lean_rl/train.py, or train_async.py's for
    --async-mode one-step / full: the code the commands run) and return its steps' metrics, one dict per
    step trained by this call, as metrics.jsonl has them. Everything the run started (Ray when it
    started it, engines, trainer) is closed on return, so a second call starts afresh. A SIGINT /
    SIGTERM stops at a step boundary and raises SystemExit(128 + signal), as the commands exit.
    Called where an event loop runs (a Jupyter cell), the run goes on a thread of its own, and an
    interrupt of the caller (KeyboardInterrupt) is relayed to it as a SIGINT."""
    from lean_rl.utils.metrics import setup_logging

    setup_logging()
    loop = _loop_of(cfg)
    rows: dict[int, dict[str, float]] = {}  # by step: a step redone after a trainer heal replaces its row
    started: list[Runtime] = []

    class RecordingRuntime(Runtime):
        def __init__(self, cfg: Config):
            super().__init__(cfg)
            started.append(self)

        def start(self) -> Runtime:
            super().start()
            if self.logger is not None:
                self.logger.on_row = lambda row: rows.__setitem__(int(row["step"]), row)
            return self

    try:
        if _event_loop_running():
            _run_on_a_thread(lambda: run(cfg, loop, RecordingRuntime), started)
        else:
            run(cfg, loop, RecordingRuntime)
    finally:
        watchdog = started[0].stop.watchdog if started else None
        if watchdog is not None:  # armed by a signal to end a command within --stop-timeout; the run has ended
            watchdog.cancel()
    return [rows[step] for step in sorted(rows)]


def _event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run_on_a_thread(call: Callable[[], None], started: list[Runtime]) -> None:
    """`call()` on a thread (asyncio.run cannot run inside a running loop), its outcome raised here.
    Python delivers signals to the main thread only: an interrupt while waiting becomes the run's SIGINT."""
    outcome: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - SystemExit of a stopped run included: raised by the caller
            outcome.append(err)
        finally:
            done.set()

    thread = threading.Thread(target=target, name="lean_rl-api-train")
    thread.start()
    interrupts = relayed = 0
    while not done.is_set():  # not Thread.join: interrupted, it can leave the thread marked ended (Python 3.11)
        try:
            done.wait(0.2)
        except KeyboardInterrupt:
            interrupts += 1
        while started and relayed < interrupts:  # the second one exits at once, as a second signal does
            started[0].stop.request_stop(signal.SIGINT)
            relayed += 1
    thread.join()
    if outcome:
        raise outcome[0]


def _loop_of(cfg: Config) -> Callable[[Runtime], Awaitable[None]]:
    if cfg.run.async_mode == "off":
        from lean_rl.train import train as sync_loop

        return sync_loop
    from lean_rl.train_async import async_loop

    return async_loop(cfg)


def _close_match(name: str, parser: argparse.ArgumentParser) -> str:
    names = [s[2:].replace("-", "_") for s in parser._option_string_actions if s.startswith("--")]
    match = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {match[0]}?" if match else ""


def _tokens(name: str, flag: str, action: argparse.Action, value: Any) -> list[Any]:
    if action.nargs == 0:  # a switch: store_true, or store_false for a --no-... flag
        if not isinstance(value, bool):
            raise ConfigError(f"{name} ({flag}) is a switch: give True or False, got {value!r}")
        return [flag] if value else []
    if isinstance(action, argparse._AppendAction):  # given once per item
        items = list(value.items()) if isinstance(value, Mapping) else _items(name, flag, value, action.nargs)
        return [token for item in items for token in [flag, *_values(name, flag, action, item)]]
    if action.nargs is None:
        token = _token(name, flag, action, value)
        # "-x" after the flag would read as a flag of its own
        return [f"{flag}={token}"] if token.startswith("-") and not isinstance(token, PythonHook) else [flag, token]
    return [flag, *_values(name, flag, action, value)]


def _items(name: str, flag: str, value: Any, nargs: Any) -> list[Any]:
    """An appended flag's items: a list of them, or a single one."""
    if not isinstance(value, (list, tuple)):
        return [value]
    if isinstance(nargs, int) and value and not isinstance(value[0], (list, tuple)):
        return [value]  # one pair, e.g. eval_prompt_data=("toy", "eval.jsonl")
    return list(value)


def _values(name: str, flag: str, action: argparse.Action, value: Any) -> list[Any]:
    if action.nargs is None:
        return [_token(name, flag, action, value)]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} ({flag}) takes several values: give a list, got {value!r}")
    if isinstance(action.nargs, int) and len(value) != action.nargs:
        raise ConfigError(f"{name} ({flag}) takes {action.nargs} values each, got {value!r}")
    return [_token(name, flag, action, item) for item in value]


def _token(name: str, flag: str, action: argparse.Action, value: Any) -> str:
    if callable(value) and not isinstance(value, str):
        if flag not in HOOK_FLAGS:
            raise ConfigError(f"{name} ({flag}) takes a value, not a function (the hooks: "
                              f"{', '.join(f[2:].replace('-', '_') for f in HOOK_FLAGS)})")
        return python_hook(value)  # a str: argparse keeps the object (the flag has no type to convert with)
    if isinstance(value, bool) or (action.type is int and not isinstance(value, int)) or (
            action.type is float and not isinstance(value, (int, float))):
        raise ConfigError(f"{name} ({flag}) takes {getattr(action.type, '__name__', 'a string')}, got {value!r}")
    if action.type is None and not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name} ({flag}) takes a string{' or a function' if flag in HOOK_FLAGS else ''}, "
                          f"got {value!r}")
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{name} ({flag}) must be one of {', '.join(map(str, action.choices))}; got {value!r}")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(float(value)) if action.type is float else str(value)


def _passthrough_tokens(name: str, flag: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [flag] if value else []
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(callable(v) or isinstance(v, (Mapping, bool)) for v in values):
        raise ConfigError(f"{name} ({flag}, passed to the servers) takes numbers or strings, got {value!r}")
    return [flag, *(str(v) for v in values)]
