"""The `args` a slime function reads: slime's own namespace (lean_rl/slime_namespace.py: every
attribute slime's parser defines, with slime's defaults and derived fields). Launched by
lean_rl.slime_launch, it is slime's parse of the slime command line (--slime-argv), so each flag reads
back as slime reads it (`--rollout-max-context-len 1024` is 1024; --eval-* flags stay apart from
--rollout-* ones); lean_rl's own flags are added under their argparse names where slime has no such
name. Run with lean_rl's flags, lean_rl's values are set over slime's defaults. Both get the names
slime sets at run time (the router's address) and the keys of --custom-config-path,
as slime sets them. One Namespace per run, built when the first slime hook runs (the router's address
is known then), mutable and deep-copyable: a function that sets `args.x` sees it on its next call, as
in slime. The run itself never reads it back."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lean_rl.options import set_flag_values
from lean_rl.slime_namespace import slime_view

if TYPE_CHECKING:  # not at run time: lean_rl.config imports every flag group
    from lean_rl.config import Config

_ARGS: dict[int, tuple[Config, argparse.Namespace]] = {}


def slime_args(cfg: Config) -> argparse.Namespace:
    """The run's `args` view (the same object on every call for one Config)."""
    entry = _ARGS.get(id(cfg))
    if entry is None or entry[0] is not cfg:
        entry = (cfg, build_args(cfg))
        _ARGS[id(cfg)] = entry
    return entry[1]


def build_args(cfg: Config) -> argparse.Namespace:
    lean = set_flag_values(argparse.Namespace(), cfg)
    for name, value in _lean_values_of_slime_names(cfg).items():
        if not hasattr(lean, name):  # a lean_rl flag of the same name says it better
            setattr(lean, name, value)
    args = slime_view(cfg.rollout.custom_config.slime_argv, lean)
    router = urlsplit(cfg.engines.router_url) if cfg.engines.router_url else None
    # slime sets these once its router is up: the run's router
    args.sglang_router_ip, args.sglang_router_port = (router.hostname, router.port) if router else (None, None)
    for key, value in dict(cfg.custom).items():  # --custom-config-path: slime sets each key on args
        setattr(args, key, value)
    return args


def _lean_values_of_slime_names(cfg: Config) -> dict:
    """slime's names that are no lean_rl flag, with what they are in a run of lean_rl's flags (slime's
    command line, when given, says them itself)."""
    engines = cfg.engines
    return {
        # slime's GenerateState semaphore is concurrency x engines; lean_rl's rollout caps the total
        "sglang_server_concurrency": max(1, cfg.rollout.max_concurrency // max(1, engines.num_engines or 1)),
        "rollout_seed": cfg.data.seed,
        "use_rollout_routing_replay": cfg.engines.return_routed_experts,
    }
