"""Rollout routing replay as a user runs it: `python -m lean_rl.train --use-rollout-routing-replay` on
the tiny Qwen3-MoE (and Mixtral, GLM-4.5). The run starts its engines recording routes, every sample carries the experts of
its tokens (dumped with it), and the trainer replays them (train/routing_mismatch_frac every step)."""

import json

import numpy as np
import pytest
from conftest import read_metrics, run_flags, run_lean_rl

from lean_rl import routed_experts

pytestmark = pytest.mark.e2e

STEPS = 3
LAYERS, TOPK, EXPERTS = 2, 2, 4  # the tiny preset


# slow (suite time, issue 24): tests/integration/test_routing_replay.py runs the engine's routes through the
# trainer's replay (log-probs closer to the engine's) and through a partial rollout; this adds the loop's plumbing
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "glm4_moe"])
def test_samples_carry_routes_and_the_trainer_replays_them(family, tiny_model_factory, toy_data, tmp_path):
    model = tiny_model_factory(family)
    flags = run_flags(model, toy_data, tmp_path, "--num-rollout", str(STEPS), "--use-rollout-routing-replay",
                      "--save-debug-rollout-data", str(tmp_path / "rollouts" / "{rollout_id}.jsonl"))
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    print(f"{family}: " + "; ".join(f"step {r['step']} mismatch {r['train/routing_mismatch_frac']:.3f} probe "
                                    f"{r['sync/probe_max_abs_diff']:.1e}" for r in rows))
    # float32 on both sides: the trainer would choose the engine's experts itself (bar exact near-ties)
    assert all(r["train/routing_mismatch_frac"] < 0.01 for r in rows), [r["train/routing_mismatch_frac"] for r in rows]
    assert all(r["train/rollout_logprob_abs_diff"] < 1e-3 and r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)
    samples = [s for line in (tmp_path / "rollouts" / "0.jsonl").read_text().splitlines() for s in json.loads(line)]
    assert len(samples) == 64
    for s in samples:
        routes = routed_experts.decode(s["routed_experts"], len(s["tokens"]) - 1).reshape(-1, LAYERS, TOPK)
        routes = routes[:, 1:] if family == "glm4_moe" else routes  # its layer 0 is dense: no route
        assert ((routes >= 0) & (routes < EXPERTS)).all() and (routes[..., 0] != routes[..., 1]).all()
    assert len({s["routed_experts"] for s in samples}) > 1 and np.isfinite([s["reward"] for s in samples]).all()
