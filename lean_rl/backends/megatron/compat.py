"""Fixes that megatron-core 0.16.1 needs to run where it was not written for: CPU + gloo, and no
TransformerEngine / Apex. Nothing here runs at import time; `apply_compat(device)` applies what the
device and the installed extras call for (idempotent), and `megatron_thread_mode(device)` (compat_cpu.py)
must wrap every call into Megatron code (the CUDA->CPU TorchFunctionMode is thread-local).

Three groups, each applied only where its cause exists:
- CPU only (explicit `device.type == "cpu"`; gloo comes with it): RNG tracker, torch.cuda
  stand-ins, the device mode, alltoall split sizes, uneven all_gather / reduce_scatter (compat_cpu.py).
- TransformerEngine absent (any device): TE-only names in moe_utils, sequence-parallel norm tagging
  (compat_no_te.py).
- Neither Apex nor TE (torch AdamW inside the distributed optimizer): checkpoint-load fixes (compat_no_te.py).
The model hooks (routing replay, chunked log-probs) are in model_hooks.py.
Line numbers refer to megatron-core 0.16.1 (site-packages/megatron/core/...).
"""

from __future__ import annotations

import threading

import torch

from lean_rl.backends.megatron.compat_cpu import apply_cpu_fixes
from lean_rl.backends.megatron.compat_no_te import apply_dist_opt_load_fixes, apply_no_te_fixes

_applied: set[str] = set()
_lock = threading.Lock()


def transformer_engine_available() -> bool:
    """Megatron's own verdict (moe_utils tried to import its TE extension at import time)."""
    from megatron.core.transformer.moe import moe_utils

    return bool(moe_utils.HAVE_TE)


def uses_te_layer_spec(device: torch.device, transformer_impl: str = "transformer_engine") -> bool:
    """The TE layer spec needs --transformer-impl transformer_engine (the default), TE and CUDA;
    everything else builds the local spec."""
    return transformer_impl == "transformer_engine" and device.type == "cuda" and transformer_engine_available()


def apply_compat(device: torch.device) -> None:
    """Apply every fix this process needs for `device`. Safe to call more than once."""
    with _lock:
        if device.type == "cpu":
            _once("cpu", apply_cpu_fixes)
        if not transformer_engine_available():
            _once("no_te", apply_no_te_fixes)
        from megatron.core.optimizer import distrib_optimizer

        if not distrib_optimizer.HAVE_APEX_OR_TE:
            _once("torch_adam_dist_opt", apply_dist_opt_load_fixes)


def _once(name: str, fn) -> None:
    if name not in _applied:
        fn()
        _applied.add(name)
