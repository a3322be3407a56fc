"""examples/distillation/run.sh as a user runs it (issue 26 §1): the main job trains the teacher, it is
converted to HF, and a student of another seed with no reward function learns the task from the teacher
alone under the default estimator (topk), with the teacher on SGLang and inside the trainer
(--opd-type megatron). Slow: the main job and three distillation runs, ~8 min."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_student_with_no_task_reward_learns_the_task_from_the_main_jobs_policy(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", str(REPO / "examples" / "distillation" / "run.sh"), "--no-tensorboard"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    sys.path.insert(0, str(REPO / "examples" / "distillation"))
    from task_reward import step_rewards

    from lean_rl.buffer.prompt_source import load_tokenizer

    tokenizer = load_tokenizer(str(tmp_path / "student"))
    topk = [reward for reward, _ in step_rewards(tmp_path / "topk" / "rollouts", tokenizer)]
    sampled = [reward for reward, _ in step_rewards(tmp_path / "sampled" / "rollouts", tokenizer)]
    in_trainer = [reward for reward, _ in step_rewards(tmp_path / "megatron" / "rollouts", tokenizer)]
    print(f"\ntask reward, topk {[round(r, 2) for r in topk]}\nsampled {[round(r, 2) for r in sampled]}"
          f"\nmegatron {[round(r, 2) for r in in_trainer]}")
    assert len(topk) == len(sampled) == len(in_trainer) == 30
    # measured: 0.09 0.09 ... 1.00 from step 9 on (the README's run); 0.09 0.08 0.11 0.31 0.84 ... with the
    # second half's mean 0.90 on another run of the teacher's main job
    for curve in (topk, in_trainer):  # the teacher on SGLang, and inside the trainer
        assert sum(curve[:2]) / 2 < 0.3 and sum(curve[15:]) / 15 >= 0.8, curve
    # the run trained on no reward at all: every reward it recorded is 0
    rows = [json.loads(line) for line in (tmp_path / "topk" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/reward_mean"] == 0 for r in rows if "rollout/reward_mean" in r)
