"""sglang-router launcher: `python -m lean_rl.backends.sglang.launch_router <sglang-router flags>`.

Same flags as `python -m sglang_router.launch_router`, plus the run's API key from the environment
($LEAN_RL_SGLANG_API_KEY, set by EngineConfig.router_env), never from argv, which any local user can
read in /proc/PID/cmdline. With the key, sglang-router 0.3.2 requires `Authorization: Bearer <key>`
on generation (/generate, /v1/completions, /v1/chat/completions, ...), /flush_cache and its worker
API (/workers); /health, /liveness, /readiness, /get_model_info, /get_server_info and /v1/models stay
open. It sends the key to the workers on what it forwards and, when a worker is added with
`{"url", "api_key"}` (RouterAdmin does), on its discovery calls (/server_info, /model_info).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV

    api_key = os.environ.pop(CHILD_API_KEY_ENV, None)
    router_args = parse_router_args(argv)
    if api_key:
        router_args.api_key = api_key
    launch_router(router_args)


if __name__ == "__main__":
    main(sys.argv[1:])
