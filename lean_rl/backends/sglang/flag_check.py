"""The engines' command lines, read by SGLang's and sglang-router's own parsers before anything starts
(lean_rl.preflight): a --sglang-<flag> / --router-<flag> their parser refuses (unknown, ambiguous,
a bad value) stops the run with one line naming the flag as the user spelled it, instead of killing
each engine at launch after lean_rl's checks said all was well.

The parsers are built as the launchers build them (sglang.srt.server_args.prepare_server_args:
ServerArgs.add_cli_args on an ArgumentParser, abbreviations allowed as there; sglang_router's
parse_router_args: RouterArgs.add_cli_args without the prefix, then RouterArgs.from_cli_args). Only
parsing runs: no model is read, nothing is started."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, NoReturn

from lean_rl.backends.sglang.server_command import router_flags, server_flags
from lean_rl.options import ConfigError

if TYPE_CHECKING:
    from lean_rl.backends.sglang.config import EngineConfig

_FLAG = re.compile(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)")
PLACEHOLDER_PORT = 30000  # the ports are not chosen yet on a cluster: any valid one parses the same


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def _user_flag(message: str, prefix: str) -> str:
    """The first flag of the parser's message, as the user wrote it (--sglang-x for SGLang's --x)."""
    found = _FLAG.search(message)
    return f"--{prefix}{found.group(1)}" if found else f"--{prefix}<flag>"


def check_server_flags(flags: list[str]) -> None:
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    try:
        parser.parse_args(flags)
    except _Refused as err:
        raise ConfigError(f"{_user_flag(str(err), 'sglang-')}: SGLang {_version()}'s parser refuses the engine "
                          f"command line: {err}") from None


def check_router_flags(flags: list[str]) -> None:
    from sglang_router.launch_router import RouterArgs

    parser = _Parser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    try:
        RouterArgs.from_cli_args(parser.parse_args(flags), use_router_prefix=False)
    except (_Refused, ValueError, TypeError) as err:
        raise ConfigError(f"{_user_flag(str(err), 'router-')}: sglang-router's parser refuses the router command "
                          f"line: {err}") from None


def check_engine_flags(config: EngineConfig) -> None:
    """The first engine's server flags and the router's, as they would be launched."""
    port = config.engine_ports[0] if config.engine_ports else PLACEHOLDER_PORT
    check_server_flags(server_flags(config, 0, port))
    router_port = config.resolved_router_port or PLACEHOLDER_PORT + 1
    check_router_flags(router_flags(config, router_port, router_port + 1))


def _version() -> str:
    from importlib.metadata import version

    return version("sglang")
