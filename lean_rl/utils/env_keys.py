"""API keys of services the user runs (a remote judge, a reward server), read from an environment
variable the user names (--judge-api-key-env, --rm-api-key-env): a key typed on the command line would
show in `ps`, shell history and Ray's job table. The key is read when a request is sent, never kept in
a config (whose repr reaches logs), and goes only to the URL it was given for."""

from __future__ import annotations

import os
import re

from lean_rl.options import ConfigError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def api_key_from_env(name: str, flag: str) -> str:
    """The key in $name; ConfigError naming the flag when the name is not a variable name or the
    variable is unset or empty."""
    if not _NAME.match(name):
        raise ConfigError(f"{flag} {name!r}: give the NAME of an environment variable (letters, digits, _), "
                          "not the key itself")
    key = os.environ.get(name, "").strip()
    if not key:
        raise ConfigError(f"{flag} {name}: the environment variable {name} is not set (or empty): export the key in it")
    return key


def bearer_header(name: str | None, flag: str) -> dict[str, str]:
    """{"Authorization": "Bearer <key>"} from $name, or {} without a name."""
    return {} if name is None else {"Authorization": f"Bearer {api_key_from_env(name, flag)}"}
