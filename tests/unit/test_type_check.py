"""The static type check of lean_rl/ (scripts/type_check.py: mypy against the pinned packages) finds
nothing beyond its baseline, and the baseline lists nothing that no longer occurs, so it only shrinks.

Most CUDA branches never run on this CPU CI; this is what reads them. A cold run takes ~1-2 min on
2 cores (mypy analyses the Megatron-core and SGLang code lean_rl calls); later runs reuse .cache/mypy."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import background_type_check
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "type_check.py"


def _type_check_module():
    spec = importlib.util.spec_from_file_location("type_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pinned_torch() -> str:
    return re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)


# The baseline was measured against the CPU lock; the GPU set (requirements-gpu.txt) has another torch
# and SGLang's CUDA dependencies, whose annotations give other findings.
pytestmark = pytest.mark.skipif(importlib.metadata.version("torch") != _pinned_torch(),
                                reason="the type-check baseline is for the CPU lock's torch "
                                       f"({_pinned_torch()}, requirements.txt)")


def test_lean_rl_has_no_type_finding_outside_the_baseline():
    # started at collection, beside the other tests (tests/background_type_check.py)
    status, output = background_type_check.result(timeout_s=700)
    assert status == 0, f"scripts/type_check.py failed:\n{output}"


def test_checker_reads_the_calls_into_megatron_sglang_and_torch_cuda(tmp_path):
    """Megatron-core and SGLang ship no py.typed: without follow_untyped_imports every call into them
    would be Any and a wrong keyword there would pass. Misspelled names on three CUDA-side APIs lean_rl uses."""
    probe = tmp_path / "probe_cuda_calls.py"
    probe.write_text(
        "import torch\n"
        "from megatron.core import parallel_state\n"
        "from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata\n"
        "FlattenedTensorMetadata(name='w', shape=torch.Size([1]), dtype=torch.float32, start_idx=0, end_idx=4,\n"
        "                        num_elements=4)\n"
        "parallel_state.get_tensor_model_parallel_rnk()\n"
        "torch.cuda.set_rng_stat(torch.zeros(1))\n")
    found = _type_check_module().findings([str(probe)])
    assert len(found) == 3, found
    for expected in ('[call-arg] Unexpected keyword argument "num_elements" for "FlattenedTensorMetadata"',
                     '[attr-defined] Module has no attribute "get_tensor_model_parallel_rnk"',
                     '[attr-defined] Module has no attribute "set_rng_stat"'):
        assert any(expected in line for line in found), (expected, found)


def test_baseline_comparison_counts_repeated_findings():
    compare = _type_check_module().compare
    same = "lean_rl/a.py: [union-attr] Item \"None\" of \"X | None\" has no attribute \"y\""
    assert compare([same, same], [same]) == ([same], [])
    assert compare([same], [same, same]) == ([], [same])
    assert compare([same], [same]) == ([], [])
