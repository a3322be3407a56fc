"""GRPO as a user runs it on each family added after the first four: `python -m lean_rl.train` on the
tiny checkpoint with no family flag; three steps train, sync and pass the probe. MoE families run with
rollout routing replay (R3): the engines' routes are replayed in the trainer's routers."""

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e

STEPS = 3
MOE_FAMILIES = ("deepseek_v3",)


# slow: the default test_model_families.py covers each family's mapping and parity; this adds the loop
@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "glm4", "deepseek_v3", "mixtral", "glm4_moe"])
def test_three_grpo_steps(family, tiny_model_factory, toy_data, tmp_path):
    r3 = ("--use-rollout-routing-replay",) if family in MOE_FAMILIES else ()
    flags = run_flags(tiny_model_factory(family), toy_data, tmp_path, "--num-rollout", str(STEPS), *r3)
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    print(f"{family}: " + "; ".join(f"step {r['step']} probe {r['sync/probe_max_abs_diff']:.1e} "
                                    f"|rollout-train log p| {r['train/rollout_logprob_abs_diff']:.1e}"
                                    + (f" routing mismatch {r['train/routing_mismatch_frac']:.3f}" if r3 else "")
                                    for r in rows))
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 and r["train/rollout_logprob_abs_diff"] < 1e-3 for r in rows)
    if r3:  # float32 on both sides: the trainer would choose the engine's experts itself (bar near-ties)
        assert all(r["train/routing_mismatch_frac"] < 0.01 for r in rows), [r["train/routing_mismatch_frac"] for r in rows]
