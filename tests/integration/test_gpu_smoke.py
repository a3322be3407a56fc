"""scripts/gpu-smoke.sh, the device check of the GPU paths, as CI can run it. Part (1), --trainer-only,
runs every step on CPU (--device cpu) as it does on a GPU, with ray, sglang and transformers made
unimportable: it must need none of them (lean_rl/testing/gpu_smoke_trainer.py). Part (2), the engine
side, needs a GPU and SGLang's GPU build; here only its argument check runs."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_the_trainer_part_runs_its_steps_on_cpu_without_ray_sglang_or_transformers(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in ("ray", "sglang", "transformers"):  # first on the path: importing any of them fails
        (hidden / f"{name}.py").write_text(f"raise ImportError('{name} is hidden from the trainer-only smoke')\n")
    env = {**os.environ, "PYTHONPATH": f"{hidden}{os.pathsep}{REPO}"}
    proc = subprocess.run(["bash", "scripts/gpu-smoke.sh", "--trainer-only", "--device", "cpu", "--out",
                           str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = {x["step"]: x for x in map(json.loads, (y for y in proc.stdout.splitlines() if y.startswith("{")))}
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert list(lines) == ["env", "reference", "export", "ipc", "train", "offload", "rng", "done"]
    assert all(line["ok"] for line in lines.values()), proc.stdout
    export, ipc, train = lines["export"], lines["ipc"], lines["train"]
    assert export["dtypes"] == ["bfloat16"] and export["tensors"] == 27 and export["buckets"] > 1  # engine dtype
    assert ipc["tensors"] == 27 and ipc["differing"] == [] and ipc["child_exit"] == 0  # opened in another process
    assert train["mean_abs_logprob_gap_after"] <= train["tolerance_mean_abs_logprob"] == 0.1
    assert train["mean_abs_logprob_gap_after"] > 0  # really bfloat16 against float32
    assert lines["offload"]["offload"] == {"offloaded": False, "reason": "device is cpu"}
    assert lines["rng"]["repeated"] and lines["done"]["imported"] == []


def test_an_unknown_step_is_a_one_line_error():
    proc = subprocess.run(["bash", "scripts/gpu-smoke.sh", "--steps", "env,warp"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--steps: unknown ['warp']" in proc.stderr
