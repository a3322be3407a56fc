"""Patches that let SGLang 0.5.23 serve on a plain x86/ARM CPU (no GPU, no AMX, no sgl_kernel CPU build).

Each patch is a function applied explicitly, only for a CPU launch, by `apply_cpu_patches()`; the
server launcher (launch.py) calls it from its top-level code so that SGLang's spawned children
(scheduler, detokenizer), which re-import the launcher as `__mp_main__`, get the same patches.
Nothing here edits site-packages. The torchvision import fix is separate (torchvision_fix.py, loaded
by a .pth in the venv) because transformers scripts and trainers need it too; we load it here as well
so a launch works even where that .pth is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Holds the `sgl_kernel` stand-in package (cpu_kernels/sgl_kernel/__init__.py).
CPU_KERNELS_DIR = Path(__file__).resolve().parent / "cpu_kernels"


def enable_sglang_cpu_engine() -> None:
    # sglang/srt/utils/common.py:221 `is_cpu()` is true only when SGLANG_USE_CPU_ENGINE=1; without it
    # `--device cpu` still takes CUDA-only paths and dies while building the model
    # (rotary embedding -> "No module named 'vllm'"). The environment variable also reaches the
    # spawned children, which inherit os.environ.
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"


def put_cpu_kernels_first() -> None:
    # sglang/srt/mem_cache/allocation.py:46 (and others) run `from sgl_kernel import ..._cpu` once
    # is_cpu() is true. PyPI's sglang-kernel is CUDA-only (fails on libcuda.so.1) and the CPU build is
    # source-only, so put our pure-torch stand-in first on sys.path (it also shadows an installed CUDA
    # sgl_kernel) and on PYTHONPATH for any child started with a fresh interpreter.
    kernels_dir = str(CPU_KERNELS_DIR)
    if "sgl_kernel" in sys.modules and not str(getattr(sys.modules["sgl_kernel"], "__file__", "")).startswith(
        kernels_dir
    ):
        raise RuntimeError(
            "a non-CPU sgl_kernel was imported before lean_rl's CPU patches; apply them first "
            "(run the server with `python -m lean_rl.backends.sglang.launch ... --device cpu`)"
        )
    if kernels_dir in sys.path:
        sys.path.remove(kernels_dir)
    sys.path.insert(0, kernels_dir)
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != kernels_dir]
    os.environ["PYTHONPATH"] = os.pathsep.join([kernels_dir, *python_path])


def keep_single_process_store_local() -> None:
    # A tp=1 server still calls torch.distributed.init_process_group(init_method="tcp://127.0.0.1:<port>",
    # world_size=1) (sglang/srt/distributed/parallel_state.py:2517, reached from
    # sglang/srt/distributed/bootstrap.py:322). torch's TCPStore server always binds all interfaces
    # (*:<port>), which would give every engine a non-loopback listener. With one process there is
    # nobody to rendezvous with, so an in-process HashStore is equivalent. Multi-process groups
    # (tp > 1) are left alone.
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_lean_rl_local_store", False):
        return
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        init_method = kwargs.get("init_method")
        if (
            kwargs.get("world_size") == 1
            and kwargs.get("store") is None
            and isinstance(init_method, str)
            and init_method.startswith("tcp://")
        ):
            kwargs = {**kwargs, "init_method": None, "store": dist.HashStore(), "rank": 0}
        return original(*args, **kwargs)

    init_process_group._lean_rl_local_store = True
    dist.init_process_group = init_process_group


def load_torchvision_fix() -> None:
    # See torchvision_fix.py: SGLang imports torchvision at config-import time, and PyPI's
    # CUDA-linked torchvision cannot import beside the CPU build of torch without it.
    from lean_rl.backends.sglang import torchvision_fix

    torchvision_fix.install()


def apply_cpu_patches() -> None:
    """All of the above, in the order they must happen (environment and sys.path before torch)."""
    enable_sglang_cpu_engine()
    put_cpu_kernels_first()
    load_torchvision_fix()
    keep_single_process_store_local()
