"""Per-sample reward routing in a run, as a user launches it: `python -m lean_rl.train --reward-routes
FILE` with a rule, a reward model served by the run (--rm-hf-checkpoint: its own engine group with
--is-embedding) and an LLM judge served by the run (--judge-hf-checkpoint: a third engine group), each
sample scored by the rewarder its row's metadata names, each route with its metrics."""

import json

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 2
ROUTES = ("rule", "rm", "judge")


def test_each_sample_is_scored_by_its_rows_rewarder(tiny_qwen2, toy_data, tmp_path):
    from lean_rl.testing.tiny_reward_model import make_tiny_reward_model

    rm_dir = make_tiny_reward_model(tmp_path / "rm", tiny_qwen2)
    data = tmp_path / "data"
    data.mkdir()
    rows = [json.loads(line) for line in (toy_data / "train.jsonl").read_text().splitlines()[:24]]
    for i, row in enumerate(rows):
        row["metadata"]["task"] = ROUTES[i % 3]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    routes = tmp_path / "routes.yaml"
    routes.write_text("field: task\nroutes:\n"
                      "  rule: {reward: lean_rl.testing.toy_task.kind_fraction_reward, concurrency: 4}\n"
                      "  rm: {reward: reward_model, concurrency: 2}\n"
                      "  judge: {reward: judge, concurrency: 2}\n")
    flags = run_flags(tiny_qwen2, data, tmp_path, "--num-rollout", str(STEPS), "--rollout-batch-size", "6",
                      "--n-samples-per-prompt", "4", "--metadata-key", "metadata", "--reward-routes", str(routes),
                      "--rm-hf-checkpoint", str(rm_dir), "--judge-hf-checkpoint", str(tiny_qwen2),
                      "--judge-template", "score_0_10", "--judge-parser", "lean_rl.testing.toy_judge.answer_length",
                      "--judge-max-new-tokens", "8", "--micro-batch-size", "8")
    at = flags.index("--custom-rm-path")
    del flags[at:at + 2]  # the routes score
    result = run_lean_rl("lean_rl.train", flags, timeout_s=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r in rows:
        assert sum(r[f"rollout/reward_route/{name}/samples"] for name in ROUTES) == 24  # 6 prompts x 4
        for name in ROUTES:
            assert r[f"rollout/reward_route/{name}/samples"] > 0 and r[f"rollout/reward_route/{name}/failed"] == 0
            assert r[f"rollout/reward_route/{name}/seconds"] > 0
        assert 0 <= r["rollout/reward_route/rule/reward_mean"] <= 1
        assert 0 < r["rollout/reward_route/judge/reward_mean"] <= 1
        assert r["rollout/reward_route/rm/reward_mean"] != r["rollout/reward_route/rule/reward_mean"]
