"""The two choices a run makes once, at parse time, for its engines' EngineConfig: the ports of the
servers and the router (resolve_ports), and the API key (resolve_api_key; where it comes from:
api_keys.py). Each returns the config rebuilt with its choice, or the same config once chosen."""

from __future__ import annotations

import os
import secrets
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from lean_rl.backends.sglang.api_keys import (API_KEY_ENV, api_key_value, file_backed, read_api_key_file,
                                              travels_by_file)
from lean_rl.backends.sglang.run_key import FileBackedKey
from lean_rl.options import ConfigError, rebuild
from lean_rl.utils.net import find_free_port

if TYPE_CHECKING:
    from lean_rl.backends.sglang.config import EngineConfig


def resolve_api_key(config: EngineConfig, environ: MutableMapping[str, str] | None = None) -> EngineConfig:
    """`config` with its API key chosen: --sglang-api-key when given, else --sglang-api-key-file, else
    $LEAN_RL_API_KEY, else a random key (secrets.token_urlsafe(32)). Call it once (config.parse_config does); a config whose key
    is chosen (or turned off) is returned as is. $LEAN_RL_API_KEY is read once and removed from
    `environ` (os.environ by default), so that no child of this process inherits it; the key is held
    as a FileBackedKey (run_key.py): the user's file, else a private copy, which is what pickles."""
    from_env = (os.environ if environ is None else environ).pop(API_KEY_ENV, None)
    if config.api_key_resolved and config.api_key_file is None:
        return config if travels_by_file(config.api_key) else rebuild(config, api_key=file_backed(config.api_key))
    if config.api_key_file is not None:
        if config.api_key is not None:
            raise ConfigError("give one of --sglang-api-key and --sglang-api-key-file, not both")
        from_file = read_api_key_file(config.api_key_file)
        backed = FileBackedKey(from_file, os.path.abspath(config.api_key_file)) if from_file else from_file
        return rebuild(config, api_key=backed, api_key_file=None)
    key = api_key_value(from_env or None, f"${API_KEY_ENV}")
    return rebuild(config, api_key=file_backed(secrets.token_urlsafe(32) if key is None else key))


def resolve_ports(config: EngineConfig) -> EngineConfig:
    """`config` with its ports chosen: engine i on --sglang-base-port + i and the router on --router-port
    when given, else free ports. Call it once (config.parse_config does); a config whose ports are
    chosen is returned as is."""
    if config.ports_resolved:
        return config
    base, n = config.base_port, config.num_engines
    chosen: set[int] = set()

    def free_port() -> int:
        for _ in range(100):
            port = find_free_port(config.host)
            if port not in chosen and not (base is not None and base <= port < base + n):
                chosen.add(port)
                return port
        raise RuntimeError(f"no free port found on {config.host}")

    engine_ports = tuple(base + i for i in range(n)) if base is not None else tuple(free_port() for _ in range(n))
    chosen.update(engine_ports)
    router_port = config.router_port if config.router_port is not None else free_port()
    return rebuild(config, engine_ports=engine_ports, resolved_router_port=router_port)
