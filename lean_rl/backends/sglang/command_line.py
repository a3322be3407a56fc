"""The command lines of SGLang's servers and of sglang-router: the flags the launcher manages itself, the
switches of a server that releases its memory (colocated on GPU), the --sglang-* / --router-* passthrough
split and merged over our defaults, and the dtype a server computes in."""

from __future__ import annotations

from dataclasses import dataclass

from lean_rl.options import ConfigError


# Flags the launcher sets itself: passing them through would silently fight it.
MANAGED_SERVER_FLAGS = {
    "model-path": "--hf-checkpoint",
    "port": "--sglang-base-port",
    "device": "nothing (the device follows torch.cuda.is_available())",
    "tp-size": "--rollout-num-gpus-per-engine",
    "base-gpu-id": "nothing (engine i uses GPUs i*per_engine ...)",
    "api-key": "--sglang-api-key",
    # with an admin key, SGLang refuses the run's key on the weight-update endpoints
    "admin-api-key": "nothing (--sglang-api-key protects every endpoint)",
}

MANAGED_ROUTER_FLAGS = {
    "host": "--sglang-host",
    "worker-urls": "nothing (the engine group adds its own servers)",
    "api-key": "--sglang-api-key",
}


# A server that releases its memory for the trainer (colocated on GPU), as slime runs one (review M1-M6):
# - without --enable-memory-saver, /release_memory_occupation answers 200 and frees nothing (the no-op
#   adapter, sglang/srt/utils/torch_memory_saver_adapter.py:139-164);
# - CUDA-graph memory is freed only with SGLANG_MEMORY_SAVER_CUDA_GRAPH=true, and then the breakable
#   prefill-graph backend raises (breakable_cuda_graph_backend.py:84-93): prefill graphs disabled;
# - /health runs a generation by default (http_server.py:721-760), which would run on released weights:
#   off, so health is "the server answers" (the monitor's process checks still catch a dead one);
# - the TP memory-imbalance check (distributed/bootstrap.py:441-455) and the idle memory check fire
#   when the trainer holds uneven memory on the same GPUs; warm-up would generate before the first sync.
COLOCATED_GPU_FLAGS = {"--enable-memory-saver": [], "--cuda-graph-backend-prefill": ["disabled"],
                       "--skip-server-warmup": []}

COLOCATED_GPU_ENV = {"SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
                     "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false",
                     "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "false"}


# A float32 engine on GPU: SGLang's default attention backend there (FA3 on Hopper, FlashInfer
# elsewhere: sglang/srt/arg_groups/model_override_base.py) has no float32 kernels and the server dies
# at its first attention call; Triton's kernels take float32 (review 2026-12-06 N1). Said at start-up
# (gpu_fp32_note); --sglang-attention-backend replaces it.
GPU_FP32_ATTENTION_BACKEND = "triton"


@dataclass(frozen=True)
class PassthroughArgs:
    server: tuple[str, ...] = ()  # `--sglang-foo v` given as `--foo v`
    router: tuple[str, ...] = ()  # `--router-foo v` given as `--foo v`
    rest: tuple[str, ...] = ()  # anything else: the caller decides (usually an error)


def split_passthrough(argv: list[str] | tuple[str, ...]) -> PassthroughArgs:
    """Split left-over command-line tokens into SGLang server flags, router flags and the rest.

    A flag owns the tokens after it up to the next `--flag`, so `--sglang-enable-foo` (a switch) and
    `--sglang-foo a b` (several values) both work; `--sglang-foo=v` is kept in one token.
    """
    server: list[str] = []
    router: list[str] = []
    rest: list[str] = []
    target = rest
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            if name.startswith("sglang-") and len(name) > len("sglang-"):
                target, token = server, "--" + token[len("--sglang-") :]
            elif name.startswith("router-") and len(name) > len("router-"):
                target, token = router, "--" + token[len("--router-") :]
            else:
                target = rest
        target.append(token)
    return PassthroughArgs(server=tuple(server), router=tuple(router), rest=tuple(rest))


def flags_to_dict(flags: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """`['--a', '1', '--b', '--c=2']` -> {'--a': ['1'], '--b': [], '--c': ['2']} (order kept)."""
    out: dict[str, list[str]] = {}
    current = None
    for token in flags:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            current = name
            out[current] = [value] if eq else []
        elif current is None:
            raise ConfigError(f"passthrough value {token!r} does not follow a --sglang-/--router- flag")
        else:
            out[current].append(token)
    return out


# SGLang's --dtype spellings (sglang/srt/configs/model_config.py _STR_DTYPE_TO_TORCH_DTYPE), by the
# dtype they mean
_DTYPE_SPELLINGS = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32",
                    "bfloat16": "bfloat16"}


def serving_dtype(requested: str, checkpoint_dtype: str | None) -> str:
    """The dtype an SGLang 0.5.23 server computes in for --dtype `requested` and a checkpoint that
    declares `checkpoint_dtype`: `auto` keeps a 16-bit checkpoint's dtype and serves a float32 (or
    undeclared) one as float16 (sglang/srt/configs/model_config.py:2283 _get_and_verify_dtype;
    Gemma's bfloat16 exception does not apply to the families lean_rl trains)."""
    requested = requested.lower()
    if requested == "auto":
        return checkpoint_dtype if checkpoint_dtype in ("bfloat16", "float16") else "float16"
    if requested not in _DTYPE_SPELLINGS:
        raise ConfigError(f"--sglang-dtype {requested!r}: choose one of auto, {', '.join(_DTYPE_SPELLINGS)}")
    return _DTYPE_SPELLINGS[requested]


def engines_dtype(server_passthrough: tuple[str, ...], trainer_dtype: str, checkpoint_dtype: str | None) -> str:
    """The dtype a run's engines serve: --sglang-dtype's meaning when given, else the trainer's."""
    given = flags_to_dict(server_passthrough).get("--dtype")
    if given is None:
        return trainer_dtype
    if len(given) != 1:
        raise ConfigError(f"--sglang-dtype takes one value, got {given}")
    return serving_dtype(given[0], checkpoint_dtype)


def merge_flags(defaults: dict[str, list[str]], overrides: dict[str, list[str]]) -> list[str]:
    merged = {**defaults, **overrides}
    return [token for name, values in merged.items() for token in (name, *values)]
