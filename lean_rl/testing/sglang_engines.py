"""Engine settings for tests and demos on the tiny models: the flags a user would type, parsed by the
same code path as a real run."""

from __future__ import annotations

import argparse
from pathlib import Path

from lean_rl.backends.megatron.hf_config import checkpoint_dtype
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.backends.sglang.command_line import engines_dtype, split_passthrough
from lean_rl.utils.device import detect_device
from lean_rl.options import add_options, read_options

# float32, so that log-probs can be compared with a transformers/Megatron float32 forward on any device;
# round_robin, so that routing is predictable; a small KV cache (the tiny models need a few MB).
TEST_ENGINE_FLAGS = (
    "--rollout-num-engines", "2",
    "--sglang-max-total-tokens", "8192",
    "--sglang-dtype", "float32",
    "--engine-start-timeout", "300",
    "--engine-request-timeout", "120",
    "--router-policy", "round_robin",
)


def engine_config_for_tests(model_path: str | Path, *extra_flags: str) -> EngineConfig:
    """EngineConfig for `model_path` from TEST_ENGINE_FLAGS, its ports and API key chosen (as in a run:
    --sglang-api-key, else $LEAN_RL_API_KEY, else random); later flags in `extra_flags` win."""
    parser = add_options(argparse.ArgumentParser(allow_abbrev=False), EngineConfig)
    args, unknown = parser.parse_known_args(["--hf-checkpoint", str(model_path), *TEST_ENGINE_FLAGS, *extra_flags])
    passthrough = split_passthrough(unknown)
    if passthrough.rest:
        raise ValueError(f"unrecognized engine flags: {' '.join(passthrough.rest)}")
    # a missing checkpoint is the engine group's to report (tests of that error pass one)
    declared = checkpoint_dtype(model_path) if (Path(model_path) / "config.json").is_file() else None
    return resolve_api_key(resolve_ports(read_options(EngineConfig, args, device=detect_device(),
                                                      server_passthrough=passthrough.server,
                                                      router_passthrough=passthrough.router,
                                                      dtype=engines_dtype(passthrough.server, "float32",
                                                                          declared))))
