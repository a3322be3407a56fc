"""PPO as a user runs it: `--advantage-estimator ppo` brings up a critic (a second Megatron group) next
to the actor; both learn, both are checkpointed at the same step, and a rerun resumes both."""

import pytest
from conftest import read_metrics, reward_gain, run_flags, run_lean_rl

from lean_rl.backends.megatron.checkpoint_paths import latest_step

pytestmark = pytest.mark.e2e

STEPS, MORE = 12, 2


def _learn_and_checkpoint(tiny_qwen2, toy_data, tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--advantage-estimator", "ppo", "--normalize-advantages",
                      "--critic-lr", "1e-3", "--save", str(ckpt), "--load", str(ckpt), "--save-interval", "5")
    result = run_lean_rl("lean_rl.train", [*flags, "--num-rollout", str(STEPS)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    first, last = reward_gain(rows)
    assert last - first >= 0.3, [round(r["rollout/reward_mean"], 3) for r in rows]
    # the value model starts at V = 0 (zero value head) and follows the returns as the reward climbs
    # (compared over 3 steps: one step's mean value is over that step's prompts, and wobbles)
    values = [r["critic/values"] for r in rows]
    early, late = sum(values[2:5]) / 3, sum(values[-3:]) / 3
    assert values[0] == 0.0 and 0 < early < late, values
    # every --save-interval and after the last rollout, the critic beside the actor at the same step
    for root in (ckpt, ckpt / "critic"):
        assert latest_step(root) == STEPS
        assert sorted(p.name for p in root.glob("iter_*")) == ["iter_0000005", "iter_0000010", "iter_0000012"]
    return flags, ckpt, values


def test_ppo_learns_and_checkpoints_its_critic(tiny_qwen2, toy_data, tmp_path):
    _learn_and_checkpoint(tiny_qwen2, toy_data, tmp_path)


# slow (suite time, issue 24): a second run; the default run keeps the critic's checkpoints above and
# the actor's exact resume (tests/e2e/test_resume.py)
@pytest.mark.slow
def test_ppo_learns_and_resumes_with_its_critic(tiny_qwen2, toy_data, tmp_path):
    flags, ckpt, values = _learn_and_checkpoint(tiny_qwen2, toy_data, tmp_path)
    result = run_lean_rl("lean_rl.train", [*flags, "--num-rollout", str(STEPS + MORE)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    log = result.stdout + result.stderr
    assert f"resumed from {ckpt} at step {STEPS}" in log and f"critic resumed from {ckpt / 'critic'} at step {STEPS}" in log
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS + MORE))
    # a fresh critic would predict 0 again; the resumed one carries on where it stopped (its mean value
    # is taken over other prompts than the last step's: seen 0.87x-1.1x of it, so the bound is loose)
    assert rows[STEPS]["critic/values"] >= 0.5 * values[-1], (rows[STEPS]["critic/values"], values)
