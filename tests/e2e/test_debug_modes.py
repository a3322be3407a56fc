"""--debug-rollout-only saves rollouts without a trainer; --debug-train-only trains on them without
engines."""

import json

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e


# slow (suite time, issue 24): two runs; tests/unit/test_debug_rollout.py holds the saved rollouts' round
# trip, and the loop both modes run is train.py's (tests/e2e/test_train_loops.py)
@pytest.mark.slow
def test_rollout_only_then_train_only_on_the_saved_rollouts(tiny_qwen2, toy_data, tmp_path):
    saved = tmp_path / "rollouts" / "{rollout_id}.jsonl"
    rollout_out, train_out = tmp_path / "gen", tmp_path / "train"
    result = run_lean_rl("lean_rl.train", run_flags(tiny_qwen2, toy_data, rollout_out, "--num-rollout", "2",
                                                    "--debug-rollout-only", "--save-debug-rollout-data", str(saved)))
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_metrics(rollout_out)
    assert [r["step"] for r in rows] == [0, 1] and not any(k.startswith("train/") for r in rows for k in r)
    for step in (0, 1):
        groups = [json.loads(line) for line in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(groups) == 8 and all(len(g) == 8 and g[0]["response_length"] > 0 for g in groups)

    result = run_lean_rl("lean_rl.train", run_flags(tiny_qwen2, toy_data, train_out, "--num-rollout", "2",
                                                    "--debug-train-only", "--load-debug-rollout-data", str(saved)))
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_metrics(train_out)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["train/optimizer_steps"] >= 1 and "rollout/reward_mean" in r for r in rows)
    assert not (train_out / "run" / "engines").exists()  # no engine was started
