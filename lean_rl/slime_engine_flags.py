"""slime's `--sglang-<flag>` spellings that SGLang 0.5.23 (lean_rl's pin) renamed or split, respelled
with a one-line notice each, before lean_rl or slime's `args` read them.

slime 624b824 targets SGLang 0.5.15 (its docker/Dockerfile); found by checking each --sglang-<flag>
slime's launch scripts, examples and docs pass against SGLang 0.5.23's own parser
(ServerArgs.add_cli_args): these are the ones it no longer knows. `--sglang-cuda-graph-bs` is the one
a script meets first: 0.5.23 split it into --cuda-graph-bs-decode / --cuda-graph-bs-prefill, so its
parser stops with `ambiguous option`. slime's CUDA graphs were the decode graphs (its prefill graph was
the piecewise one), so the decode flag takes slime's values. Any other --sglang-<flag> is checked by
SGLang's own parser before an engine starts (backends/sglang/flag_check.py)."""

from __future__ import annotations

from collections.abc import Sequence

# old flag -> (new flag, why); a switch that became a valued flag: (new flag, value, why) in SWITCHES
RENAMED = {
    "--sglang-cuda-graph-bs": ("--sglang-cuda-graph-bs-decode", "SGLang split it into -decode / -prefill; slime's "
                               "batch sizes were the decode graph's"),
    "--sglang-cuda-graph-max-bs": ("--sglang-cuda-graph-max-bs-decode", "SGLang split it into -decode / -prefill; "
                                   "slime's was the decode graph's"),
    "--sglang-nsa-decode-backend": ("--sglang-dsa-decode-backend", "SGLang renamed NSA to DSA"),
    "--sglang-nsa-prefill-backend": ("--sglang-dsa-prefill-backend", "SGLang renamed NSA to DSA"),
    "--sglang-fp8-gemm-runner-backend": ("--sglang-fp8-gemm-backend", "SGLang renamed it"),
    "--sglang-mamba-scheduler-strategy": ("--sglang-mamba-radix-cache-strategy", "SGLang renamed it"),
    "--sglang-disable-piecewise-cuda-graph": ("--sglang-disable-prefill-cuda-graph", "the piecewise graph is "
                                              "SGLang's prefill graph now"),
}
SWITCHES = {
    "--sglang-enable-deepep-moe": ("--sglang-moe-a2a-backend", "deepep", "SGLang dropped the switch"),
}
# --sglang-enable-ep-moe made SGLang's expert-parallel size the engine's tensor-parallel size
EP_MOE = "--sglang-enable-ep-moe"


def respell(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(argv with slime's old SGLang spellings in SGLang 0.5.23's, one notice per flag respelled)."""
    out: list[str] = []
    notices: list[str] = []
    tokens = list(argv)
    for i, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if name in RENAMED:
            new, why = RENAMED[name]
            out.append(new + eq + value)
            notices.append(f"slime flag {name} -> {new} for SGLang 0.5.23 ({why})")
        elif name in SWITCHES:
            new, fixed, why = SWITCHES[name]
            out += [new, fixed]
            notices.append(f"slime flag {name} -> {new} {fixed} for SGLang 0.5.23 ({why})")
        elif name == EP_MOE:
            size = _value_of(tokens, "--rollout-num-gpus-per-engine") or "1"
            out += ["--sglang-ep-size", size]
            notices.append(f"slime flag {name} -> --sglang-ep-size {size} for SGLang 0.5.23 (the switch made the "
                           "expert-parallel size the engine's GPUs, --rollout-num-gpus-per-engine)")
        else:
            out.append(token)
    return out, notices


def _value_of(tokens: list[str], flag: str) -> str | None:
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            return tokens[i + 1]
        if token.startswith(flag + "="):
            return token.partition("=")[2]
    return None

