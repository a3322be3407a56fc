"""Options declared once. A config dataclass field made with `option(...)` carries its flag name,
type, default, help and range; `add_options` turns a config class into an argparse group and
`read_options` turns parsed flags back into the frozen config. No flag is written anywhere else.

    @dataclass(frozen=True)
    class RunConfig:
        num_rollout: int = option(10, positive=True, help="rollout + train steps of the run")
        tensorboard: bool = option(True, flag="--no-tensorboard")   # a flag that turns a default off

The flag defaults to `--field-name`; the argparse type comes from the annotation (`bool` is a
switch, `tuple[T, ...]` takes several values, `X | None` takes an X). A nested config field made
with `group(...)` adds its class's options under its own title. Fields made with plain `field()`
are derived: `read_options` takes them as keyword arguments (computed once, in config.parse_config),
or the class's own `derive_fields` step computes them (see `build`); `__post_init__` only checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Callable, TypeVar, cast

_KEY = "lean_rl.option"
_T = TypeVar("_T")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag (or file) to fix."""


def _spec(kind: str, **spec: Any) -> dict:
    return {_KEY: dict(kind=kind, **spec)}


def option(default: Any = dataclasses.MISSING, *, flag: str | None = None, help: str | None = None,
           choices: typing.Sequence | None = None, metavar: Any = None, nargs: Any = None, action: str | None = None,
           positive: bool = False, at_least: float | None = None, convert: Callable[[Any], Any] | None = None,
           suppress_default_in_help: bool = False, secret: bool = False) -> Any:
    """A field set by one command-line flag. `positive` / `at_least` reject values out of range
    (None, the unset value, is always allowed); `convert` maps the parsed value to the field's;
    `secret` keeps the value out of the config's repr (and so out of logs and tracebacks)."""
    spec = _spec("option", flag=flag, help=help, choices=choices, metavar=metavar, nargs=nargs, action=action,
                 positive=positive, at_least=at_least, convert=convert)
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata=spec, repr=not secret)


def group(cls: type, title: str | None = None) -> Any:
    """A nested config whose options are added with `cls`'s own (in a group of their own if `title`)."""
    return dataclasses.field(default_factory=cls, metadata=_spec("group", cls=cls, title=title))


def _meta(f: dataclasses.Field) -> dict | None:
    return f.metadata.get(_KEY)


def flag_of(cls: type, name: str) -> str:
    """The flag that sets field `name` of `cls` (for messages)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    meta = _meta(f)
    if meta is None or meta["kind"] != "option":
        raise KeyError(f"{cls.__name__}.{name} is not an option")
    return meta["flag"] or "--" + name.replace("_", "-")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def options_of(cls: type) -> list[tuple[dataclasses.Field, dict, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, _meta(f), hints[f.name]) for f in dataclasses.fields(cls) if _meta(f) is not None]


def add_options(parser: argparse.ArgumentParser, cls: type, title: str | None = None,
                container: Any = None) -> argparse.ArgumentParser:
    """Add `cls`'s options (and its nested groups') to `parser`, under `title` if given."""
    target = container if container is not None else (parser.add_argument_group(title) if title else parser)
    for f, meta, tp in options_of(cls):
        if meta["kind"] == "group":
            add_options(parser, meta["cls"], meta["title"], None if meta["title"] else target)
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": _dest(flag), "help": meta["help"]}
        base = _strip_optional(tp)
        default = f.default
        if base is bool and meta["action"] is None:
            kwargs["action"] = "store_false" if default is True else "store_true"
            kwargs["dest"] = f.name if default is True else kwargs["dest"]
        elif meta["action"] is not None:
            kwargs.update(action=meta["action"], default=default, nargs=meta["nargs"], metavar=meta["metavar"])
            kwargs["default"] = [] if meta["action"] == "append" else default
        else:
            if typing.get_origin(base) is tuple:
                item = typing.get_args(base)[0]
                kwargs["nargs"] = meta["nargs"] or "*"
                base = item
            elif meta["nargs"] is not None:
                kwargs["nargs"] = meta["nargs"]
            kwargs.update(type=base if base in (int, float) else None, default=default,
                          choices=meta["choices"], metavar=meta["metavar"])
        parser_target = target
        parser_target.add_argument(flag, **{k: v for k, v in kwargs.items() if v is not None or k == "default"})
    return parser


def _dest_of(f: dataclasses.Field, meta: dict, tp: Any) -> str:
    flag = meta["flag"] or "--" + f.name.replace("_", "-")
    if _strip_optional(tp) is bool and meta["action"] is None and f.default is True:
        return f.name
    return _dest(flag)


def set_flag_values(namespace: argparse.Namespace, config: Any) -> argparse.Namespace:
    """Every option of `config` (and of the configs inside it) set on `namespace` under the name
    argparse gives its flag, as the parser would have read it (tuples as lists): the `args` view a
    hook written for slime reads (lean_rl/slime_compat/args.py, algorithms/slime_contracts.py)."""
    if not dataclasses.is_dataclass(config):
        return namespace
    by_name = {f.name: (meta, tp) for f, meta, tp in options_of(type(config))}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in by_name and by_name[f.name][0]["kind"] == "group":
            set_flag_values(namespace, value)  # an option group: its flags are this config's
            continue
        if f.name not in by_name:  # a nested config (Config's parts, a derived copy such as eval's sampling):
            inner = set_flag_values(argparse.Namespace(), value)  # a flag's own value wins over a copy's
            for name, inner_value in vars(inner).items():
                if not hasattr(namespace, name):
                    setattr(namespace, name, inner_value)
            continue
        meta, tp = by_name[f.name]
        setattr(namespace, _dest_of(f, meta, tp), list(value) if isinstance(value, tuple) else value)
    return namespace


def _check(value: Any, meta: dict, flag: str) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if meta["positive"] and value <= 0:
        raise ConfigError(f"{flag} must be > 0, got {value}")
    if meta["at_least"] is not None and value < meta["at_least"]:
        raise ConfigError(f"{flag} must be >= {meta['at_least']}, got {value}")


def build(cls: type[_T], **given: Any) -> _T:
    """Construct the config `cls` from `given` values: first its derive step, then its checks.

    A class whose fields depend on others (a default taken from another flag, a count computed from
    the layout) declares `derive_fields(values: dict) -> dict` as a staticmethod: it receives every init
    field (given, else its default) plus any extra inputs the caller passed (e.g. the response
    budget), and returns the field values with the derived ones filled. `__post_init__` only checks:
    a frozen config is never assigned after its construction (tests/unit/test_config_derive.py)."""
    derive = getattr(cls, "derive_fields", None)
    if derive is None:
        return cls(**given)
    values = {f.name: given[f.name] if f.name in given else _default_of(f)
              for f in dataclasses.fields(cast(Any, cls)) if f.init and (f.name in given or _has_default(f))}
    values.update({k: v for k, v in given.items() if k not in values})  # extra inputs of the derive step
    return cls(**derive(values))


def rebuild(config: _T, **changes: Any) -> _T:
    """`dataclasses.replace` for a config with a derive step: the derived values are computed again
    from the changed fields (replace alone would copy them as they were)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(cast(Any, config)) if f.init}
    return build(type(config), **{**values, **changes})


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def read_options(cls: type, args: argparse.Namespace, **derived: Any) -> Any:
    """Build `cls` from parsed flags; `derived` supplies (or overrides) fields computed elsewhere
    (and the inputs of the class's derive step, see `build`)."""
    values: dict[str, Any] = {}
    for f, meta, tp in options_of(cls):
        if f.name in derived or not f.init:
            continue
        if meta["kind"] == "group":
            values[f.name] = read_options(meta["cls"], args)
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        value = _as_tuple(getattr(args, _dest_of(f, meta, tp)))
        _check(value, meta, flag)
        values[f.name] = meta["convert"](value) if meta["convert"] else value
    return build(cls, **values, **derived)


def defaults_of(cls: type) -> argparse.Namespace:
    """The parsed namespace of an empty command line (every option at its default)."""
    return add_options(argparse.ArgumentParser(add_help=False), cls).parse_args([])
