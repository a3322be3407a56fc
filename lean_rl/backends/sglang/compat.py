"""Everything that reaches into SGLang's (or, on SGLang's behalf, torch's) internals, one function per
fix, each applied explicitly by its caller. No module-level torch import: the CPU patches must run
before torch is imported.

Server side: patches that let SGLang 0.5.23 serve on a plain x86/ARM CPU (no GPU, no AMX, no
sgl_kernel CPU build), applied only for a CPU launch by `apply_cpu_patches()`; the server launcher
(launch.py) calls it from its top-level code so that SGLang's spawned children (scheduler,
detokenizer), which re-import the launcher as `__mp_main__`, get the same patches.
Nothing here edits site-packages. The torchvision import fix is separate (torchvision_fix.py, loaded
by a .pth in the venv) because transformers scripts and trainers need it too; we load it here as well
so a launch works even where that .pth is missing.

Client side (the trainer's weight sync, lean_rl.weight_sync): what a process talking to SGLang's
weight-update endpoints must do the way SGLang does it: `join_weight_update_group` (the trainer's
half of /init_weights_update_group) and `patch_torch_cuda_ipc_reductions` (before serializing CUDA
tensors for /update_weights_from_tensor).
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
    # nobody to rendezvous with, so an in-process HashStore is equivalent. Applied on every device.
    # Multi-process groups (tp > 1, GPU) are left alone: their store still listens on all interfaces.
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


_SECRET_SERVER_ARGS = ("api_key", "admin_api_key")


def redact_server_args_logging() -> None:
    """Server side, every device. SGLang logs `server_args={...}` (its resolved args, the key included) when it starts
    (sglang/srt/entrypoints/engine.py:1185, via _server_args_for_logging): log the key as '<redacted>'."""
    from sglang.srt.entrypoints import engine

    original = engine._server_args_for_logging
    if getattr(original, "_lean_rl_redacts", False):
        return

    def for_logging(server_args):
        values = original(server_args)
        if isinstance(values, dict):
            values = {k: ("<redacted>" if k in _SECRET_SERVER_ARGS and v else v) for k, v in values.items()}
        return values

    for_logging._lean_rl_redacts = True
    engine._server_args_for_logging = for_logging


def load_torchvision_fix() -> None:
    # See torchvision_fix.py: SGLang imports torchvision at config-import time, and PyPI's
    # CUDA-linked torchvision cannot import beside the CPU build of torch without it.
    from lean_rl.backends.sglang import torchvision_fix

    torchvision_fix.install()


def allocate_host_buffers_unpinned() -> None:
    # --enable-return-routed-experts (rollout routing replay) keeps every token's routes in a host
    # buffer: sglang/srt/state_capturer/base.py:67 allocates it with ALLOC_MEMORY_FUNCS[device] and
    # pin_memory=True; for device "cpu" that is the default, alloc_with_host_register
    # (sglang/srt/mem_cache/pool_host/common.py:330), which calls cudaHostRegister (common.py:147
    # `torch.cuda.cudart()`) and on a CPU-only torch fails the server's start with
    # "AssertionError: Torch not compiled with CUDA enabled". Pinning only speeds copies from a GPU,
    # and a CPU engine has none: give "cpu" the same allocation, unpinned. `destroy` unregisters only
    # on CUDA/HIP (base.py:85), so nothing else needs the pinning.
    from sglang.srt.mem_cache.pool_host import common

    def allocate_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        return allocator.allocate(dims, dtype=dtype, device=device)

    common.ALLOC_MEMORY_FUNCS["cpu"] = allocate_unpinned


def serve_lora_without_pinned_memory() -> None:
    # --enable-lora (LoRA adapters synced on their own, weight_sync/transports/adapter.py): SGLang's LoRA
    # layers and its torch_native backend build small host index tensors with pin_memory=True
    # (sglang/srt/lora/layers.py:145, 324, 479, 723, 814; lora/backend/torch_backend.py:237, 241, 244),
    # which a CPU-only torch refuses ("pin_memory=True requires a CUDA or other accelerator backend"):
    # the server dies while wrapping its first linear layer; so does Tensor.pin_memory() (layers.py:594,
    # torch_backend.py:225-234, mem_pool.py:765) with "Cannot access accelerator device". Pinning only
    # speeds copies to a GPU: in those two modules `torch` is torch with the pin_memory argument
    # dropped, and in this process (a CPU server, which has no accelerator) pin_memory() is the tensor.
    import types

    import torch
    from sglang.srt.lora import layers
    from sglang.srt.lora.backend import torch_backend

    def unpinned(factory):
        def make(*args, pin_memory=False, **kwargs):
            return factory(*args, **kwargs)
        return make

    torch_unpinned = types.ModuleType("torch")
    torch_unpinned.__dict__.update(torch.__dict__)
    for name in ("tensor", "empty", "zeros", "ones", "arange", "full"):
        setattr(torch_unpinned, name, unpinned(getattr(torch, name)))
    layers.torch = torch_backend.torch = torch_unpinned
    setattr(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: self)  # noqa: B010 (a method, replaced)


def start_children_by_fork() -> None:
    # sglang/srt/entrypoints/engine.py:1995 `mp.set_start_method("spawn", force=True)`: SGLang starts its
    # scheduler and detokenizer by spawn, which is what CUDA needs (a forked CUDA context is unusable).
    # A CPU server has no CUDA context, and spawn costs each child a fresh interpreter that imports
    # torch and SGLang again: 12-35 s of a server's start on 2 cores (measured side by side: spawn
    # 25-47 s, fork 12.5-13 s from launch to the first answer). On CPU the children are forked, so
    # they inherit the imported modules and the patches above. Only "spawn" is replaced.
    import multiprocessing

    set_start_method = multiprocessing.set_start_method
    if getattr(set_start_method, "_lean_rl_forks", False):
        return

    def fork_instead_of_spawn(method, force=False):
        set_start_method("fork" if method == "spawn" else method, force=force)

    fork_instead_of_spawn._lean_rl_forks = True  # type: ignore[attr-defined]
    multiprocessing.set_start_method = fork_instead_of_spawn


def apply_cpu_patches() -> None:
    """All of the above, in the order they must happen (environment and sys.path before torch)."""
    enable_sglang_cpu_engine()
    put_cpu_kernels_first()
    load_torchvision_fix()
    keep_single_process_store_local()
    allocate_host_buffers_unpinned()
    serve_lora_without_pinned_memory()
    start_children_by_fork()
    from lean_rl.backends.sglang.mla_cpu import serve_mla_on_torch_native
    from lean_rl.backends.sglang.vlm_cpu import define_qwen3_5_import_time_ops

    define_qwen3_5_import_time_ops()  # Qwen-VL processors (vlm_cpu.py says why)

    serve_mla_on_torch_native()  # last: it imports SGLang (mla_cpu.py says why)


# -- client side: the trainer talking to SGLang ------------------------------------------------------


def join_weight_update_group(store, world_size: int, rank: int, group_name: str, backend: str, timeout_s: float):
    """Build (as `rank`) the process group SGLang's engines join on /init_weights_update_group, the way
    they build it: sglang/srt/utils/common.py:2859 `init_custom_process_group` (SGLang 0.5.23), over
    PrefixStore(group_name, store). Blocks until every member has joined (or the timeout).

    Two torch-private steps, both copied from that recipe:
    - `_new_process_group_helper` (torch/distributed/distributed_c10d.py:1984, torch 2.13): the only
      way to make a group that is not carved out of the default world (the engines have their own).
    - `_world.pg_group_ranks[pg] = identity` (SGLang: common.py:2925): the helper does not register
      the group's rank mapping (new_group does, distributed_c10d.py:6071). Without it the engines'
      `broadcast(src=0, group=...)` (model_runner_components/weight_updater.py:288) cannot map src
      to a group rank, and on our side destroy_process_group (distributed_c10d.py:2438,
      `del _world.pg_group_ranks[pg]`) raises KeyError. Identity: group ranks are their own global
      ranks, so src=0 is the trainer on both sides."""
    import datetime

    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), PrefixStore(group_name, store),
                                      group_name=group_name, timeout=datetime.timedelta(seconds=timeout_s))
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def patch_torch_cuda_ipc_reductions() -> None:
    """Before serializing CUDA tensors (CUDA IPC handles) for /update_weights_from_tensor: name the
    GPU by its UUID instead of this process's device index, as the engines expect. The engine's TP
    workers apply the same patch before deserializing (sglang/srt/managers/tp_worker.py:198,
    model_runner_components/weight_updater.py:352) and map the UUID back to their own index, which
    differs from ours whenever the processes see different CUDA_VISIBLE_DEVICES; unpatched, the
    engine would open the handle on the wrong GPU. SGLang's function
    (sglang/srt/utils/patch_torch.py:41 `monkey_patch_torch_reductions`, "before Torch
    https://github.com/pytorch/pytorch/pull/149248 is fixed") replaces torch.multiprocessing's
    reduce_tensor / rebuild_cuda_tensor once per process (idempotent: it returns early when already
    applied), so one call per process, before the first payload, is enough."""
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    monkey_patch_torch_reductions()
