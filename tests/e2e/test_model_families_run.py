"""GRPO as a user runs it on each family added after the first four: `python -m lean_rl.train` on the
tiny checkpoint with no family flag; three steps train, sync and pass the probe."""

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e

STEPS = 3


# slow: the default test_model_families.py covers each family's mapping and parity; this adds the loop
@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "glm4", "mixtral", "glm4_moe"])
def test_three_grpo_steps(family, tiny_model_factory, toy_data, tmp_path):
    flags = run_flags(tiny_model_factory(family), toy_data, tmp_path, "--num-rollout", str(STEPS))
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    print(f"{family}: " + "; ".join(f"step {r['step']} probe {r['sync/probe_max_abs_diff']:.1e} "
                                    f"|rollout-train log p| {r['train/rollout_logprob_abs_diff']:.1e}" for r in rows))
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 and r["train/rollout_logprob_abs_diff"] < 1e-3 for r in rows)
