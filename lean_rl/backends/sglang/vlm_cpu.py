"""CPU patch that lets SGLang 0.5.23 register its Qwen-VL multimodal processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

Why: sglang/srt/multimodal/processors/qwen_vl.py:25 imports sglang/srt/models/interns2_mobius.py, which
imports sglang/srt/models/qwen3_5.py; with SGLANG_USE_CPU_ENGINE=1 that module looks up four ops in the
`torch.ops.sgl_kernel` namespace at import time (qwen3_5.py:284, :292, :294, :297). Without the real CPU
sgl_kernel build the lookup raises AttributeError, SGLang's processor registry
(sglang/srt/managers/multimodal_processor.py:24) logs and skips the whole qwen_vl module, and the server
dies at start with "No processor registered for architecture: ['Qwen2_5_VLForConditionalGeneration']".
Defining the four names as ops that raise when called lets the module import; only Qwen3.5's own layers
call them, so a Qwen3.5 model still fails loudly (NotImplementedError) rather than computing garbage.
"""

from __future__ import annotations

from typing import Any

# name -> schema of the ops qwen3_5.py looks up at import time (the schemas only have to be valid).
_IMPORT_TIME_OPS = {
    "fused_sigmoid_mul_cpu": "(Tensor(a!) x, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu": "(Tensor[] args) -> Tensor[]",
    "fused_qk_gemma_rmsnorm_with_gate_cpu": "(Tensor[] args) -> Tensor[]",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": "(Tensor[] args) -> Tensor[]",
}
_LIBRARY: list[Any] = []  # a torch Library unregisters its ops when collected; keep it alive


def define_qwen3_5_import_time_ops() -> None:
    import torch

    if _LIBRARY:
        return
    namespace = torch.ops.sgl_kernel
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name, schema in _IMPORT_TIME_OPS.items():
        if hasattr(namespace, name):  # a real sgl_kernel CPU build defines it
            continue
        lib.define(name + schema)

        def missing(*args: Any, _name: str = name, **kwargs: Any) -> Any:
            raise NotImplementedError(
                f"torch.ops.sgl_kernel.{_name} is only a name (lean_rl/backends/sglang/vlm_cpu.py); "
                "this SGLang path needs the real sgl_kernel CPU build"
            )

        lib.impl(name, missing, "CompositeExplicitAutograd")
    _LIBRARY.append(lib)
