"""Megatron-core 0.16.1 on CPU + gloo (applied by compat.apply_compat when the device is the CPU): an RNG
tracker, torch.cuda stand-ins, alltoall split sizes, uneven all_gather / reduce_scatter; and the CUDA->CPU
TorchFunctionMode that megatron_thread_mode(device) puts around every call into Megatron code (it is
thread-local). Line numbers refer to megatron-core 0.16.1 (site-packages/megatron/core/...)."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode


def apply_cpu_fixes() -> None:
    _install_cpu_rng_tracker()
    _install_cuda_api_stand_ins()
    _fix_alltoall_split_sizes()
    _fix_uneven_first_dim_collectives()


def _install_cpu_rng_tracker() -> None:
    # tensor_parallel/random.py:235-241: CudaRNGStatesTracker.add() reads and writes
    # torch.cuda.get_rng_state(), so model_parallel_cuda_manual_seed() crashes without CUDA.
    # initialize_rng_tracker() (random.py:315) looks the class up by module-global name at call
    # time, so replacing that name makes Megatron keep CPU generator states instead.
    from megatron.core.tensor_parallel import random as mrandom

    base = mrandom.CudaRNGStatesTracker

    class CPURNGStatesTracker(base):
        def add(self, name, seed):
            if seed in self.seeds_:
                raise RuntimeError(f"RNG seed {seed} already exists")
            if name in self.states_:
                raise RuntimeError(f"RNG state {name!r} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise RuntimeError(f"RNG state {name!r} was never added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    mrandom.CudaRNGStatesTracker = CPURNGStatesTracker


class _NoOpEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        return None

    def wait(self, *args, **kwargs):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True


class _SingletonStream:
    """One stream object, so `current_stream() != side_stream` checks (token_dispatcher.py:445)
    see the same stream and skip record_stream, which CPU tensors do not have."""

    _instance: "_SingletonStream | None" = None

    def __new__(cls, *args, **kwargs):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def wait_stream(self, *args, **kwargs):
        return None

    def wait_event(self, *args, **kwargs):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True

    def record_event(self, event=None):
        return event if event is not None else _NoOpEvent()


def _install_cuda_api_stand_ins() -> None:
    # torch.cuda.current_device() is used as `device=` all over megatron/core (e.g.
    # rotary_pos_embedding.py:162, tensor_parallel/mappings.py:91, moe/router.py:90,
    # p2p_communication.py:313); synchronize at p2p_communication.py:398; streams and events in
    # the alltoall dispatcher (token_dispatcher.py:445, 871-898). On a CPU build these raise.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.Stream = _SingletonStream
    torch.cuda.Event = _NoOpEvent
    torch.cuda.current_stream = lambda *args, **kwargs: _SingletonStream()
    torch.cuda.default_stream = lambda *args, **kwargs: _SingletonStream()
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()


def _fix_alltoall_split_sizes() -> None:
    # moe_utils.py:1093: maybe_move_tensor_to_cpu() converts only `is_cuda` tensors, so on CPU the
    # alltoall dispatcher's split sizes stay tensors and gloo's all_to_all_single rejects them
    # (it needs List[int]). token_dispatcher.py:31 imported the name, so patch both modules.
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor):
            tensor = tensor.cpu().numpy() if as_numpy else tensor.cpu()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _fix_uneven_first_dim_collectives() -> None:
    # tensor_parallel/mappings.py:150 and :193: with split sizes (the alltoall dispatcher with expert
    # TP and EP > 1, token_dispatcher.py) Megatron calls all_gather / reduce_scatter on a list of
    # unequal tensors; gloo rejects that ("invalid tensor size"). Same results through collectives
    # gloo has: pad-to-max all_gather, and all_to_all_single + sum for the reduce-scatter. The
    # autograd functions look these module globals up at call time.
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    original_gather = mappings._gather_along_first_dim
    original_reduce_scatter = mappings._reduce_scatter_along_first_dim

    def gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return original_gather(input_, group, output_split_sizes, use_global_buffer)
        longest = max(output_split_sizes)
        padded = input_.new_zeros((longest, *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        pieces = [torch.empty_like(padded) for _ in range(group.size())]
        dist.all_gather(pieces, padded, group=group)
        return torch.cat([piece[:size] for piece, size in zip(pieces, output_split_sizes)], dim=0)

    def reduce_scatter_along_first_dim(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return original_reduce_scatter(input_, group, input_split_sizes, use_global_buffer)
        mine = input_split_sizes[group.rank()]
        received = input_.new_empty((mine * group.size(), *input_.shape[1:]))
        dist.all_to_all_single(received, input_.contiguous(), output_split_sizes=[mine] * group.size(),
                               input_split_sizes=list(input_split_sizes), group=group)
        return received.view(group.size(), mine, *input_.shape[1:]).sum(dim=0)

    mappings._gather_along_first_dim = gather_along_first_dim
    mappings._reduce_scatter_along_first_dim = reduce_scatter_along_first_dim


def _is_cuda_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


def _called_from_megatron(depth: int) -> bool:
    """Whether the frame `depth` levels above the caller of this function runs megatron/core code
    (depth 1: the caller's caller; +1 for this function's own frame)."""
    return "megatron/core/" in sys._getframe(depth + 1).f_code.co_filename


class CudaToCpuMode(TorchFunctionMode):
    """Hard-coded CUDA in megatron/core -> CPU:
    - `device="cuda"` in factory calls: transformer/utils.py:35 (default causal mask),
      optimizer.py:481/485/907, clip_grads.py:103/174, schedules.py:596/2138;
    - `Tensor.cuda()`: distrib_optimizer.py:1089; `.to("cuda")`;
    - `x.type() == 'torch.cuda.FloatTensor'` checks: clip_grads.py:167 (assert), optimizer.py:690,
      distrib_optimizer.py:420 -> answer with the CUDA type name, but only to callers in megatron."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda.") and _called_from_megatron(1):
                name = "torch.cuda." + name[len("torch."):]
            return name
        if _is_cuda_device(kwargs.get("device")):
            kwargs = dict(kwargs, device="cpu")
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)

_thread_state = threading.local()


@contextlib.contextmanager
def megatron_thread_mode(device: torch.device) -> Iterator[None]:
    """Wrap every call into Megatron code with this. On CPU it enters CudaToCpuMode for the current
    thread (TorchFunctionModes are thread-local, so a mode entered at import time on one thread does
    nothing on another); re-entering on the same thread is a no-op. On CUDA it does nothing."""
    if device.type != "cpu" or getattr(_thread_state, "active", False):
        yield
        return
    _thread_state.active = True
    try:
        with CudaToCpuMode():
            yield
    finally:
        _thread_state.active = False
