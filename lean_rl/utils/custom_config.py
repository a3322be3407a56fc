"""--custom-config-path: a YAML file of extra settings for the user's functions, read once at start-up
into `cfg.custom` (and `cfg.algorithm.custom`, which the trainer-side hooks get), a read-only mapping.
slime loads the same file into attributes of its `args`; here it stays apart from the typed flags,
so a key can never shadow or change one of them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lean_rl.options import ConfigError, option


@dataclass(frozen=True)
class CustomConfigFlags:
    custom_config_path: str | None = option(
        None, help="YAML file (a mapping) of extra settings for user functions, read into cfg.custom")
    # secret: a slime command line may hold --wandb-key
    slime_argv: str | None = option(None, secret=True, help=(
        "set by python -m lean_rl.slime_launch: slime's command line (a JSON list); the `args` of slime "
        "functions is slime's namespace for it (lean_rl/slime_namespace.py)"))


class ReadOnlyMapping(Mapping):
    """A mapping nobody can change (nested mappings are read-only too, lists become tuples); it pickles,
    so it travels with the config to the trainer's ranks."""

    def __init__(self, data: Mapping | None = None):
        self._data = {key: _frozen(value) for key, value in (data or {}).items()}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, name: str) -> Any:
        """`cfg.custom.my_key` as well as `cfg.custom["my_key"]` (as slime's `args.my_key`)."""
        data = self.__dict__.get("_data", {})
        if name in data:
            return data[name]
        raise AttributeError(f"cfg.custom has no key {name!r} (keys: {sorted(data)}; set it in --custom-config-path)")

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_data" or "_data" in self.__dict__:
            raise TypeError("cfg.custom is read-only (it is the --custom-config-path file as read at start-up)")
        object.__setattr__(self, name, value)

    def __reduce__(self):
        return ReadOnlyMapping, (_thawed(self),)

    def __repr__(self) -> str:
        return f"ReadOnlyMapping({_thawed(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:  # frozen dataclasses holding it stay hashable
        return hash(tuple(sorted(self._data)))


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return value if isinstance(value, ReadOnlyMapping) else ReadOnlyMapping(value)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thawed(v) for key, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


def load_custom_config(path: str | None) -> ReadOnlyMapping:
    """The file's top-level mapping (empty without a path). Errors name the flag, the file and, for a
    YAML syntax error, the line and column."""
    return ReadOnlyMapping(load_yaml_mapping(path, "--custom-config-path") or {})


def load_yaml_mapping(path: str | None, flag_name: str) -> dict | None:
    """The YAML file `path` (given with `flag_name`) as a mapping with string keys; None without a path."""
    if path is None:
        return None
    import yaml

    flag = f"{flag_name} {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{flag}: cannot read the file ({err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{flag_name}: {where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: the file must hold a mapping (key: value lines), got a {type(data).__name__}")
    bad = [key for key in data if not isinstance(key, str)]
    if bad:
        raise ConfigError(f"{flag}: top-level keys must be strings, got {bad}")
    return data
