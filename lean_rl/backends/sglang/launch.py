"""SGLang server launcher: `python -m lean_rl.backends.sglang.launch <sglang server flags>`.

Same flags as `python -m sglang.launch_server`. When the flags say `--device cpu`, the CPU patches
(compat.py) are applied by this module's top-level code, before SGLang is imported. On CPU one of them
makes SGLang fork its scheduler and detokenizer (compat.start_children_by_fork), so the children
inherit the patches; on a GPU SGLang spawns them, which restores the parent's sys.argv and re-imports
the parent's main module (this file, as `__mp_main__`), so spawned children patch themselves the same
way. The decision comes from argv, not from an environment variable, so a GPU launch from the same
shell is never patched.

The API key is the exception: it comes from the environment ($LEAN_RL_SGLANG_API_KEY, set by
EngineConfig.server_env), never from argv, which any local user can read in /proc/PID/cmdline. It
becomes SGLang's `api_key`: every endpoint but /health*, /ready* and /metrics* then requires
`Authorization: Bearer <key>` (sglang/srt/utils/auth.py decide_request_auth). SGLang logs its
resolved server args at start-up; the key is redacted there.
"""

from __future__ import annotations

import os
import sys


def device_from_argv(argv: list[str]) -> str | None:
    """The value of `--device` in SGLang server flags (`--device cpu` or `--device=cpu`), else None."""
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return None


if device_from_argv(sys.argv[1:]) == "cpu":
    from lean_rl.backends.sglang.compat import apply_cpu_patches

    apply_cpu_patches()
else:  # on every device: a tp=1 server's process group needs no TCP store (see compat.py)
    from lean_rl.backends.sglang.compat import keep_single_process_store_local

    keep_single_process_store_local()
from lean_rl.backends.sglang.vlm_cache import keep_no_image_embeddings  # noqa: E402

keep_no_image_embeddings()  # image embeddings must not outlive a weight update (vlm_cache.py says why)
if "--is-embedding" in sys.argv[1:]:  # a reward model (--rm-hf-checkpoint): its score head as transformers'
    from lean_rl.backends.sglang.reward_compat import zero_missing_score_bias

    zero_missing_score_bias()


def main(argv: list[str]) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from lean_rl.backends.sglang.compat import redact_server_args_logging
    from lean_rl.backends.sglang.api_keys import CHILD_API_KEY_ENV

    # Out of the environment SGLang's own children inherit; they get it with the pickled server args.
    api_key = os.environ.pop(CHILD_API_KEY_ENV, None)
    load_plugins()
    server_args = prepare_server_args(argv)
    if api_key:
        server_args.api_key = api_key  # before run_server resolves (and seals) the args
    redact_server_args_logging()  # compat.py: SGLang logs its args, the key included
    try:
        run_server(server_args)
    finally:
        # Same as sglang/launch_server.py: take the scheduler/detokenizer down with the HTTP server.
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
