"""A verifiers environment trained as it is (issue 28 §2): examples/verifiers_env/toy_env.py, a
SingleTurnEnv and its rubric written with the verifiers library only, through --verifiers-env: its
dataset feeds the buffer, its rollout runs against the capture endpoint, its rubric's reward trains
the tiny model, and the reward rises. verifiers is an optional extra (requirements-envs.txt), so the
test is slow (by hand: pip install -r requirements-envs.txt -c requirements.txt; pytest -m slow)."""

import json
import os

import pytest
from conftest import REPO, read_metrics, reward_gain, run_flags, run_lean_rl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 12


def test_a_verifiers_environment_trains_and_its_reward_rises(tiny_qwen2, toy_data, tmp_path):
    pytest.importorskip("verifiers", reason="the optional extra: pip install -r requirements-envs.txt")
    flags = [f for f in run_flags(tiny_qwen2, toy_data, tmp_path, "--colocate", "--num-rollout", str(STEPS),
                                  "--dump-samples-interval", "1", "--verifiers-env", "toy_env.load_environment")]
    # the environment brings its own prompts and reward: neither --prompt-data nor --custom-rm-path
    for flag in ("--prompt-data", "--custom-rm-path"):
        at = flags.index(flag)
        del flags[at:at + 2]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "examples" / "verifiers_env"), str(REPO),
                                          os.environ.get("PYTHONPATH", "")]),
           "TOY_ENV_MODEL": str(tiny_qwen2), "TOY_ENV_PROMPTS": "256"}
    result = run_lean_rl("lean_rl.train", flags, extra_env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    first, last = reward_gain(rows)
    print(f"\nverifiers env reward {[round(r['rollout/reward_mean'], 3) for r in rows]}")
    assert last > first + 0.2, (first, last)
    trained = [json.loads(line) for line in (tmp_path / "run" / "samples" / "step_000000.jsonl").read_text().splitlines()]
    for s in trained:
        assert s["prompt"][0]["role"] == "user" and s["label"] in ("digits", "letters")  # the env's dataset
        assert s["prompt"][0]["content"].startswith(f"answer in {s['label']}: ")
        assert {"kind_fraction", "answer_length"} <= set(s["metadata"]["rewards"])  # the rubric's metrics
        assert s["reward"] == pytest.approx(s["metadata"]["rewards"]["kind_fraction"])  # weights 1, 0
        assert set(s["weight_versions"]) == {0} and all(s["loss_mask"])
