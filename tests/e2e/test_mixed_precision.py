"""The main job with a 16-bit engine, the dtype SGLang serves on a GPU: the start-up probe passes (it
judges the mean |Δ log p| when either side is 16-bit: weight_sync/config.py) and the toy task is
learned. The weights travel in the engine's dtype: half the bytes of the float32 trainer's."""

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

from lean_rl.weight_sync.config import DEFAULT_PROBE_TOL

pytestmark = pytest.mark.e2e

STEPS = 14


def _learns_with_a_bf16_engine(tiny_qwen2, toy_data, tmp_path, *trainer_flags):
    result = run_lean_rl("lean_rl.train", run_flags(tiny_qwen2, toy_data, tmp_path, "--sglang-dtype", "bfloat16",
                                                    *trainer_flags, "--num-rollout", str(STEPS)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    rewards = [round(r["rollout/reward_mean"], 3) for r in rows]
    print(f"\nreward {rewards}\nprobe mean |Δ log p| {[round(r['sync/probe_mean_abs_diff'], 4) for r in rows]} "
          f"max {[round(r['sync/probe_max_abs_diff'], 3) for r in rows]}")
    assert rewards[0] < 0.3 and sum(rewards[-2:]) / 2 >= 0.9, rewards
    assert all(r["sync/probe_mean_abs_diff"] <= DEFAULT_PROBE_TOL["bfloat16"] for r in rows)
    assert any(r["sync/probe_max_abs_diff"] > 1e-3 for r in rows)  # 16-bit: not the float32 agreement
    return result, rows


def test_main_job_with_a_bf16_engine(tiny_qwen2, toy_data, tmp_path):
    result, rows = _learns_with_a_bf16_engine(tiny_qwen2, toy_data, tmp_path)
    from safetensors import safe_open

    parameters = 0
    for path in tiny_qwen2.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            parameters += sum(_numel(f.get_slice(name).get_shape()) for name in f.keys())
    assert rows[0]["sync/bytes"] == 2 * parameters  # sent as bfloat16 (2 bytes each), not float32
    assert "engines serve the trainer's weights (version 0)" in result.stderr


@pytest.mark.slow
def test_main_job_with_a_bf16_engine_and_a_bf16_trainer(tiny_qwen2, toy_data, tmp_path):
    _learns_with_a_bf16_engine(tiny_qwen2, toy_data, tmp_path, "--bf16")


def _numel(shape) -> int:
    out = 1
    for dim in shape:
        out *= dim
    return out
