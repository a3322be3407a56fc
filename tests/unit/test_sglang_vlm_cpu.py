"""vlm_cpu.define_qwen3_5_import_time_ops: the names SGLang's Qwen-VL processor module needs at import exist,
and calling one fails loudly instead of computing anything."""

import pytest
import torch

from lean_rl.backends.sglang.vlm_cpu import _IMPORT_TIME_OPS, define_qwen3_5_import_time_ops


def test_names_defined_and_raise_when_called():
    define_qwen3_5_import_time_ops()
    define_qwen3_5_import_time_ops()  # idempotent: a second call must not redefine (torch would refuse)
    for name in _IMPORT_TIME_OPS:
        assert hasattr(torch.ops.sgl_kernel, name), name
    with pytest.raises(NotImplementedError, match="fused_sigmoid_mul_cpu"):
        torch.ops.sgl_kernel.fused_sigmoid_mul_cpu(torch.zeros(2), torch.zeros(2))
