"""Megatron-core 0.16.1 without TransformerEngine or Apex (applied by compat.apply_compat where they are
absent, on any device): the TE-only names moe_utils leaves undefined and sequence-parallel norm tagging;
and, with neither Apex nor TE (torch AdamW inside the distributed optimizer), the checkpoint-load fixes.
Line numbers refer to megatron-core 0.16.1 (site-packages/megatron/core/...)."""

from __future__ import annotations

import torch


def apply_no_te_fixes() -> None:
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


# ---------------------------------------------------------------- the distributed optimizer with torch AdamW
# (no Apex / TE fused Adam)
def apply_dist_opt_load_fixes() -> None:
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
