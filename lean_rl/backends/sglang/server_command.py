"""The command lines of an engine group's processes, built from its EngineConfig (config.py): every
flag of each SGLang server (for `python -m lean_rl.backends.sglang.launch`) and of sglang-router (for
`python -m lean_rl.backends.sglang.launch_router`). Their environments, which carry the API key, are
EngineConfig.server_env() / router_env(); a user's `--sglang-<flag>` replaces our default for
`--<flag>` (command_line.merge_flags)."""

from __future__ import annotations

import sys

from lean_rl.backends.sglang.command_line import (COLOCATED_GPU_FLAGS, GPU_FP32_ATTENTION_BACKEND, flags_to_dict,
                                                  merge_flags)
from lean_rl.backends.sglang.config import DEFAULT_CPU_MAX_TOTAL_TOKENS, EngineConfig


def gpu_fp32_note(config: EngineConfig) -> str | None:
    """The start-up line for float32 engines on GPU (which attention backend they get, and why), or None."""
    if config.device != "cuda" or config.dtype != "float32":
        return None
    chosen = (flags_to_dict(config.server_passthrough).get("--attention-backend") or [GPU_FP32_ATTENTION_BACKEND])[0]
    return (f"engines serve float32 on GPU (--sglang-dtype float32): attention backend {chosen} (SGLang's GPU "
            "default, FA3 / FlashInfer, has no float32 kernels); 16-bit serving is the GPU default")


def router_command(config: EngineConfig, port: int, prometheus_port: int) -> list[str]:
    """The router's whole command line; start it with config.router_env() in its environment."""
    flags = router_flags(config, port, prometheus_port)
    return [sys.executable, "-m", "lean_rl.backends.sglang.launch_router", *flags]


def server_flags(config: EngineConfig, engine_index: int, port: int) -> list[str]:
    """Every flag of engine `engine_index`'s server (for `python -m lean_rl.backends.sglang.launch`)."""
    assert config.model_path is not None  # validate_engine_config refuses a config without one
    flags: dict[str, list[str]] = {
        "--model-path": [config.model_path],
        "--host": [config.host],
        "--port": [str(port)],
        # explicit on every device: SGLang's `auto` serves a float32 checkpoint as float16
        "--dtype": [config.dtype],
    }
    if config.device == "cpu":
        # Why each: sglang needs torch_native attention without AMX kernels; sleep-on-idle because
        # the scheduler otherwise busy-polls a core (measured in DESIGN.md §4).
        flags.update({"--device": ["cpu"], "--attention-backend": ["torch_native"]})
        flags["--max-total-tokens"] = [str(config.max_total_tokens or DEFAULT_CPU_MAX_TOTAL_TOKENS)]
        flags["--sleep-on-idle"] = []
    else:
        flags["--tp-size"] = [str(config.gpus_per_engine)]
        flags["--base-gpu-id"] = [str(engine_index * config.gpus_per_engine)]
        if config.max_total_tokens is not None:
            flags["--max-total-tokens"] = [str(config.max_total_tokens)]
        if config.releases_memory:
            flags.update(COLOCATED_GPU_FLAGS)
        if config.dtype == "float32":  # FA3 (Hopper's default) and FlashInfer have no float32 kernels (N1)
            flags["--attention-backend"] = [GPU_FP32_ATTENTION_BACKEND]
    if config.mem_fraction_static is not None:
        flags["--mem-fraction-static"] = [str(config.mem_fraction_static)]
    if config.return_routed_experts:
        flags["--enable-return-routed-experts"] = []
    if config.adapter is not None:
        flags.update(config.adapter.server_flags(config.device))
    return merge_flags(flags, flags_to_dict(config.server_passthrough))


def router_flags(config: EngineConfig, port: int, prometheus_port: int) -> list[str]:
    """Every flag of sglang-router (for `python -m lean_rl.backends.sglang.launch_router`, which
    adds the API key from its environment); workers come later."""
    flags = {
        "--host": [config.host],
        "--port": [str(port)],
        # The router's metrics endpoint binds 0.0.0.0 by default.
        "--prometheus-host": [config.host],
        "--prometheus-port": [str(prometheus_port)],
        # At info level it logs every request, which a rollout turns into gigabytes.
        "--log-level": ["warn"],
    }
    return merge_flags(flags, flags_to_dict(config.router_passthrough))
