"""scripts/gpu-smoke.sh, the device check of the GPU paths, as CI can run it: its CPU-able steps (env,
trainer) with the device set to CPU. On a GPU the same steps run with --device cuda, plus the engine
ones (lean_rl/testing/gpu_smoke.py)."""

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_the_cpu_steps_of_the_gpu_smoke_check(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu-smoke.sh", "--device", "cpu", "--steps", "env,trainer", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0 and [x["step"] for x in lines] == ["env", "trainer"], proc.stdout + proc.stderr[-3000:]
    env, trainer = lines
    assert env["ok"] and env["rank_nccl_env"] == {}  # the NCCL switches are for GPU ranks only
    fp32, bf16 = trainer["float32"], trainer["bfloat16"]
    assert fp32["max_abs_logprob_diff_vs_hf_fp32"] < 1e-4  # the in-process rank computes the HF model
    assert 1e-3 < bf16["max_abs_logprob_diff_vs_hf_fp32"] < 1.0  # really bf16, and still that model
    assert fp32["weights_identical_after_onload"] and fp32["offload"] == {"offloaded": False, "reason": "device is cpu"}


def test_an_unknown_step_is_a_one_line_error():
    proc = subprocess.run(["bash", "scripts/gpu-smoke.sh", "--steps", "env,warp"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--steps: unknown ['warp']" in proc.stderr
