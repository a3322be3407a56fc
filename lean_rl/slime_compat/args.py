"""The `args` a slime function reads: an argparse.Namespace with slime's attribute names, built from
the run's Config. Every lean_rl flag is there under its argparse name (lean_rl keeps slime's names,
so `args.rollout_temperature`, `args.n_samples_per_prompt`, `args.hf_checkpoint` ... read as in slime),
plus the names slime derives or spells differently (SLIME_ONLY below), plus the keys of
--custom-config-path set as attributes, as slime sets them. One Namespace per run, built when the
first slime hook runs (the router's address is known then), mutable and deep-copyable: a function
that sets `args.x` sees it on its next call, as in slime. The run itself never reads it back."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lean_rl.options import set_flag_values

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
    args = argparse.Namespace()
    set_flag_values(args, cfg)
    for name, value in _slime_only(cfg).items():
        if not hasattr(args, name):  # a lean_rl flag of the same name says it better
            setattr(args, name, value)
    for key, value in dict(cfg.custom).items():  # --custom-config-path: slime sets each key on args
        setattr(args, key, value)
    return args


def _slime_only(cfg: Config) -> dict:
    """slime's names that are no lean_rl flag (derived, or spelled differently)."""
    router = urlsplit(cfg.engines.router_url) if cfg.engines.router_url else None
    engines = cfg.engines
    return {
        "sglang_router_ip": router.hostname if router else None,
        "sglang_router_port": router.port if router else None,
        # slime's GenerateState semaphore is concurrency x engines; lean_rl's rollout caps the total
        "sglang_server_concurrency": max(1, cfg.rollout.max_concurrency // max(1, engines.num_engines or 1)),
        "sglang_dp_size": 1,
        "rollout_seed": cfg.data.seed,
        "rollout_max_context_len": None,  # slime: no bound on prompt + response unless the flag sets one
        "rollout_skip_special_tokens": False,
        "use_rollout_routing_replay": cfg.engines.return_routed_experts,
        "mask_offpolicy_in_partial_rollout": False,
        "use_distributed_post": False,
        "sglang_enable_deterministic_inference": False,
        "router_policy": None,
        "sglang_model_routers": None,
    }
