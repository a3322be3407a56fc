"""A save that fills --save's disk mid-run: one line naming the path and the space, exit status 2, no
step trained after it, and the previous checkpoint still loads (converted back to HF weights by the
project's own converter). --save is a tmpfs sized for one checkpoint but not two."""

import math
import subprocess
import sys

import pytest
from safetensors import safe_open

from tests.e2e.conftest import REPO, run_flags, run_lean_rl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _num_params(model) -> int:
    total = 0
    for path in model.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


@pytest.fixture
def small_disk(tmp_path, tiny_qwen2):
    mount = tmp_path / "small_disk"
    mount.mkdir()
    # the start-up check wants 16 bytes per parameter free; one checkpoint takes ~12 (weights + Adam)
    size = 20 * _num_params(tiny_qwen2)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is refused here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_save_that_fills_the_disk_stops_the_run_with_one_line(tiny_qwen2, toy_data, tmp_path, small_disk):
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", "4", "--save", str(small_disk),
                      "--save-interval", "1")
    result = run_lean_rl("lean_rl.train", flags)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines[-1].startswith(f"lean_rl: error: --save {small_disk}: no space left on its disk while saving step 2"), \
        lines[-1]
    assert "step 1's checkpoint stays loadable" in lines[-1] and "GiB free" in lines[-1]
    # step 0 trained and saved (checkpoint 1), step 1 trained and its save failed: nothing logged after it
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
    converted = subprocess.run([sys.executable, "tools/convert_ckpt/megatron_to_hf.py", "--load", str(small_disk),
                                "--hf-config", str(tiny_qwen2), "--save", str(tmp_path / "hf")], cwd=REPO,
                               capture_output=True, text=True, timeout=600)
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert list((tmp_path / "hf").glob("*.safetensors"))
