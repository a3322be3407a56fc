"""LoRA on the actor, the whole loop: `python -m lean_rl.train --lora-rank 8` raises the toy task's reward
as full fine-tuning does, the engines pass the probe after every sync (they serve their base with the
adapter loaded apart, --lora-sync auto: each sync moves the adapters' bytes only), and the KL
reference is the base model (zero KL before the first update)."""

import pytest
from conftest import read_metrics, reward_gain, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e

STEPS = 12
MARGIN = 0.3  # as test_train_loops: the random policy scores ~0.1


# the tiny Qwen2: 2 layers of (q 64 + k 32 + v 32 + o 64 + gate 256 + up 256 + down 64 rows) x rank 8 for B,
# and 7 A's of rank 8 x (64 columns, 256 for down_proj) per layer, float32
ADAPTER_BYTES = 4 * 2 * 8 * ((64 + 32 + 32 + 64 + 256 + 256 + 64) + (6 * 64 + 256))


def test_lora_learns_and_the_engines_serve_the_adapter(tiny_qwen2, toy_data, tmp_path):
    # LoRA moves fewer weights: it takes a larger learning rate than full fine-tuning's 1e-3
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--colocate", "--ci-test", "--num-rollout", str(STEPS),
                      "--lora-rank", "8", "--lr", "1e-2", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl")
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    log = result.stdout + result.stderr
    assert "LoRA rank 8, alpha / rank 2: 16 adapter tensors" in log
    assert "LoRA sync: the adapters only (rank 8, q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)" in log
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    rewards = [round(r["rollout/reward_mean"], 3) for r in rows]
    first, last = reward_gain(rows)
    assert first < 0.3 and last - first >= MARGIN, rewards
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows), [r["sync/probe_max_abs_diff"] for r in rows]
    assert all(r["train/rollout_logprob_abs_diff"] < 1e-3 for r in rows)
    assert {r["sync/bytes"] for r in rows} == {ADAPTER_BYTES}  # 92 kB; the merged weights are ~750 kB
    assert rows[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-6) and rows[-1]["train/kl_loss"] > 0
