"""The run's API key (docs/security.md): where it comes from (--sglang-api-key, --sglang-api-key-file,
$LEAN_RL_API_KEY, else a random one: config.resolve_api_key), how it is written in a header, and how it
reaches the children (their environment) and Ray actors (the path of its private file, run_key.py)."""

from __future__ import annotations

import re

from lean_rl.backends.sglang.run_key import FileBackedKey, read_private_first_line, write_key_file
from lean_rl.options import ConfigError


# The run's API key: the flag, else this environment variable, else a random key (resolve_api_key).
API_KEY_ENV = "LEAN_RL_API_KEY"


# How a server (launch.py) and the router (launch_router.py) receive the key: their environment.
CHILD_API_KEY_ENV = "LEAN_RL_SGLANG_API_KEY"


# `--sglang-api-key none` (or LEAN_RL_API_KEY=none): no authentication. Stored as NO_API_KEY.
API_KEY_OFF = "none"

NO_API_KEY = ""


# What goes into an HTTP header unquoted: printable ASCII, no spaces.
_API_KEY_CHARS = re.compile(r"[\x21-\x7e]+")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>`, the header SGLang and sglang-router check; {} for no key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def api_key_value(value: str | None, source: str) -> str | None:
    """A key as given (flag or environment): None (not given) stays None, 'none' turns
    authentication off (NO_API_KEY), anything else must fit in an HTTP header."""
    if value is None:
        return None
    if value.strip().lower() == API_KEY_OFF:
        return NO_API_KEY
    if not _API_KEY_CHARS.fullmatch(value):
        # never echo the value: it is a secret
        raise ConfigError(f"{source}: an API key is printable ASCII without spaces ({len(value)} characters "
                          f"given); '{API_KEY_OFF}' turns authentication off")
    return value


def read_api_key_file(path: str) -> str:
    """The key in `path` (its first line, stripped), or a ConfigError naming the flag and the file
    (never the key); a file its group or others may access is refused (run_key.py)."""
    flag = f"--sglang-api-key-file {path}"
    first = read_private_first_line(path, flag)
    if not first:
        raise ConfigError(f"{flag}: the file is empty (write the key on its first line, or '{API_KEY_OFF}')")
    return api_key_value(first, flag)


def travels_by_file(key: str | None) -> bool:
    """No key, authentication off, or a key that pickles as its file's path."""
    return not key or isinstance(key, FileBackedKey)


def file_backed(key: str | None) -> str | None:
    return write_key_file(key) if key and not travels_by_file(key) else key
