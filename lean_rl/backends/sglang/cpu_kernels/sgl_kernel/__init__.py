"""Pure-torch stand-in for the CPU build of `sgl_kernel`, put first on sys.path by compat.py.

Why: with SGLANG_USE_CPU_ENGINE=1, SGLang imports CPU ops from `sgl_kernel` at import time
(e.g. sglang/srt/mem_cache/allocation.py:46). PyPI's sglang-kernel is CUDA-only, and the real CPU
build is source-only and targets AVX512/AMX Xeons. For a dense model served with
`--attention-backend torch_native` on a CPU without AMX, the only op SGLang calls is
`assign_req_to_token_pool_cpu`; it is implemented here. Every other name still imports (SGLang
imports some unconditionally) but raises NotImplementedError when called, so a code path that
needs a real kernel fails loudly instead of computing garbage.
"""

import torch

__version__ = "0.0.0+lean_rl.torch_stand_in"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For each request i: req_to_token[req_pool_indices[i], start[i]:end[i]] = the next
    (end[i] - start[i]) entries of out_cache_loc (requests' slots are packed back to back)."""
    consumed = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        if length > 0:
            req_to_token[row, start:end] = out_cache_loc[consumed : consumed + length].to(req_to_token.dtype)
        consumed += length


def __getattr__(name: str):
    if name.startswith("__"):  # keep Python's own protocol lookups (__path__, __spec__, ...) honest
        raise AttributeError(name)

    def missing_op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by lean_rl's pure-torch CPU stand-in "
            "(lean_rl/backends/sglang/cpu_kernels/sgl_kernel); this SGLang code path needs the real "
            "sgl_kernel build (a GPU, or an AMX CPU with the source-built CPU kernels)"
        )

    missing_op.__name__ = name
    return missing_op
