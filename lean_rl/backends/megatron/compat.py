"""Fixes that megatron-core 0.16.1 needs to run where it was not written for: CPU + gloo, and no
TransformerEngine / Apex. Nothing here runs at import time; `apply_compat(device)` applies what the
device and the installed extras call for (idempotent), and `megatron_thread_mode(device)` must wrap
every call into Megatron code (the CUDA->CPU TorchFunctionMode is thread-local).

Three groups, each applied only where its cause exists:
- CPU only (explicit `device.type == "cpu"`; gloo comes with it): RNG tracker, torch.cuda
  stand-ins, the device mode, alltoall split sizes, uneven all_gather / reduce_scatter.
- TransformerEngine absent (any device): TE-only names in moe_utils, sequence-parallel norm tagging.
- Neither Apex nor TE (torch AdamW inside the distributed optimizer): checkpoint-load fixes.
Line numbers refer to megatron-core 0.16.1 (site-packages/megatron/core/...).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

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
            _once("cpu", _apply_cpu_fixes)
        if not transformer_engine_available():
            _once("no_te", _apply_no_te_fixes)
        from megatron.core.optimizer import distrib_optimizer

        if not distrib_optimizer.HAVE_APEX_OR_TE:
            _once("torch_adam_dist_opt", _apply_dist_opt_load_fixes)


def _once(name: str, fn) -> None:
    if name not in _applied:
        fn()
        _applied.add(name)


# ---------------------------------------------------------------------------------------------
# CPU fixes
# ---------------------------------------------------------------------------------------------


def _apply_cpu_fixes() -> None:
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


# ---------------------------------------------------------------------------------------------
# TransformerEngine absent
# ---------------------------------------------------------------------------------------------


def _apply_no_te_fixes() -> None:
    # moe_utils.py:24-39 imports these from TE inside try/except without defining them on failure,
    # then moe_utils.py:1192 reads `te_general_gemm` -> NameError in the MoE router. Define them as
    # None, which is what every use site (e.g. moe_utils.py:118, 322, 653) tests for.
    from megatron.core.transformer import torch_norm
    from megatron.core.transformer.moe import moe_utils

    for name in ("te_general_gemm", "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss",
                 "fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_topk_with_score_function",
                 "fused_unpermute"):
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)

    # torch_norm.py:32: WrappedTorchNorm (the local spec's RMSNorm) asserts sequence parallel is
    # off, yet MoE training with TP > 1 requires it (moe_layer.py:379). A norm is correct under SP as long as
    # its params are tagged `sequence_parallel`, so finalize_model_grads all-reduces their grads
    # over TP; build the norm with SP masked, then tag.
    original_new = torch_norm.WrappedTorchNorm.__new__

    def new_norm(cls, config, hidden_size, eps=1e-5, **kwargs):
        sequence_parallel = config.sequence_parallel
        config.sequence_parallel = False
        try:
            norm = original_new(cls, config, hidden_size, eps, **kwargs)
        finally:
            config.sequence_parallel = sequence_parallel
        for param in norm.parameters():
            param.sequence_parallel = sequence_parallel
        return norm

    torch_norm.WrappedTorchNorm.__new__ = staticmethod(new_norm)


# ---------------------------------------------------------------------------------------------
# Distributed optimizer with torch AdamW (no Apex / TE fused Adam)
# ---------------------------------------------------------------------------------------------


def _apply_dist_opt_load_fixes() -> None:
    # Loading a DistributedOptimizer checkpoint with fp32 params and torch AdamW:
    # (a) distrib_optimizer.py:642 asserts one common 'step' over the inner optimizer's state, which
    #     a fresh optimizer does not have -> create the state with dummy values before is_loading;
    # (b) distrib_optimizer.py:940 copies into main params that are views of leaf params (needs
    #     no_grad) and expects a 'step' tensor in the checkpoint tensors (KeyError);
    # (c) distrib_optimizer.py:823 aliases ONE step tensor across all params, so torch Adam bumps it
    #     once per param per step -> give each param its own copy. 'step' itself was already
    #     restored from param_groups by load_state_dict.
    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    original_sharded_state_dict = cls.sharded_state_dict
    original_set_states = cls._set_main_param_and_optimizer_states

    def sharded_state_dict(self, model_sharded_state_dict=None, is_loading=False, *args, **kwargs):
        if is_loading and len(self.optimizer.state) == 0:
            self._init_optimizer_states_with_dummy_values()
        if model_sharded_state_dict is None:
            model_sharded_state_dict = {}
        return original_sharded_state_dict(self, model_sharded_state_dict, is_loading, *args, **kwargs)

    def set_main_param_and_optimizer_states(self, model_param, tensors):
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original_set_states(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        state = self.optimizer.state[main_param]
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()
        with torch.no_grad():
            for key, dst in {"param": main_param, **state}.items():
                if key != "step" and key in tensors:
                    dst.copy_(tensors[key])
        return None

    cls.sharded_state_dict = sharded_state_dict
    cls._set_main_param_and_optimizer_states = set_main_param_and_optimizer_states


# ---------------------------------------------------------------------------------------------
# Rollout routing replay (any device)
# ---------------------------------------------------------------------------------------------


def install_route_replay(model: torch.nn.Module) -> int:
    """Give every TopKRouter of `model` a routing_replay.RouteReplay; returns how many.

    Megatron's own hook: TopKRouter.routing passes `self.router_replay` (router.py:583) to
    topk_routing_with_score_function, which asks it for the top-k (moe_utils.py:705
    `router_replay.get_replay_topk(scores, topk, num_groups, group_topk, _compute_topk)`). Megatron
    fills the attribute itself with moe_enable_routing_replay (router.py:205-207), but its REPLAY_FORWARD
    (router_replay.py:146-152) gathers the target indices as given: a token the engine has no route for
    (NO_ROUTE, -1) would index out of range, and it cannot report where its own choice would differ.
    So the config flag stays off and the attribute is set here, once, after the model is built. The
    fused router (moe_utils.py:652, TE) would ignore the hook: model.py leaves moe_router_fusion off."""
    from megatron.core.transformer.moe.router import TopKRouter

    from lean_rl.backends.megatron.routing_replay import RouteReplay

    count = 0
    for module in model.modules():
        if isinstance(module, TopKRouter):
            if module.layer_number is None:
                raise RuntimeError("a MoE router without its layer number: cannot tell which routes are its own")
            module.router_replay = RouteReplay(module.layer_number, bool(module.config.sequence_parallel))
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# Chunked log-probs: the output layer hands back its input (any device)
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def hidden_states_from_output_layer(model: torch.nn.Module) -> Iterator[None]:
    """Within the context, this rank's GPTModel returns its last hidden states [b, s, h] (after the
    final norm) where it returns logits [b, s, V/tp]: GPTModel._postprocess calls
    `self.output_layer(hidden_states, weight=output_weight, ...)` (gpt_model.py:685) and returns
    `logits.transpose(0, 1).contiguous()` (gpt_model.py:712) with no other use of them, so an output
    layer that returns its input makes the model's output the hidden states, and
    chunked_logprobs.py makes the logits a chunk at a time. The input goes through the same TP
    region ColumnParallelLinear puts it in (layers.py:244-251 and its linear function): gathered
    over the sequence under sequence parallel (backward: reduce-scatter), else replicated (backward:
    all-reduce), since each TP rank's gradient is that of its vocab shard only. The layer keeps its
    parameters, state-dict names and embedding tying; only this instance's forward is replaced, and
    restored on exit. A stage without the output layer (not the last) is left as it is."""
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    from lean_rl.backends.megatron.chunked_logprobs import unwrapped

    gpt = unwrapped(model)
    layer = getattr(gpt, "output_layer", None) if getattr(gpt, "post_process", False) else None
    if layer is None:
        yield
        return
    if gpt.config.mtp_num_layers:
        raise ValueError("--logits-chunk-size needs a model without multi-token prediction layers "
                         "(they call the output layer for their own loss); pass --logits-chunk-size 0")

    def hidden_states(input_: torch.Tensor, weight=None, runtime_gather_output=None):
        if layer.sequence_parallel:
            return gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=True), None
        if layer.allreduce_dgrad:
            return _SumGradientOverTensorParallel.apply(input_), None
        return input_, None

    layer.forward = hidden_states
    try:
        yield
    finally:
        del layer.forward


class _SumGradientOverTensorParallel(torch.autograd.Function):
    """Identity forward; backward: the gradient summed over the TP group. Megatron's own
    copy_to_tensor_model_parallel_region does this, but its _reduce (tensor_parallel/mappings.py:31)
    all-reduces `grad.contiguous()` and returns the original `grad`: a non-contiguous gradient (the
    one GPTModel's `transpose(0, 1).contiguous()` hands back to the hidden states, gpt_model.py:712)
    comes back unreduced, each rank keeping only its vocab shard's share. Here the reduced tensor is
    the one returned."""

    @staticmethod
    def forward(ctx, input_: torch.Tensor) -> torch.Tensor:
        return input_.view_as(input_)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state

        summed = grad.contiguous()
        dist.all_reduce(summed, group=parallel_state.get_tensor_model_parallel_group())
        return summed
