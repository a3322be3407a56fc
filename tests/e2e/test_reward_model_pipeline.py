"""examples/reward_model_pipeline/run.sh as a user runs it, smaller: preference pairs of the toy task, a reward
model trained on them (real Megatron on Ray) and converted to HF, GRPO against it served by the run (real
SGLang reward engines beside the policy's) in 3 rounds, the reward model refitted between them on pairs of the
policy's own samples, DPO on the same pairs, the evaluation and the plots. The reward model must rank held-out
pairs above chance, and the rule reward GRPO never trained on must rise."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO


@pytest.mark.slow  # 19 min on 2 cores at load ~20-38: 7 runs (3 reward models, 3 GRPO rounds with reward engines, DPO)
@pytest.mark.timeout(2800)  # its run's own deadline (2700 s), beyond slow_tiers' default --timeout=900
def test_reward_model_pipeline_learns_the_hidden_rule(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "MAIN": "0", "NUM_TRAIN": "256", "PAIRS_PER_PROMPT": "3",
           "RM_STEPS": "24", "GRPO_STEPS": "12", "ROUNDS": "3", "DPO_STEPS": "4", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(["bash", "examples/reward_model_pipeline/run.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=2700)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    print(done.stdout[-2500:])

    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    heldout = next(r for r in results if "accuracy" in r)
    assert heldout["pairs"] == 256 and heldout["accuracy"] > 0.6, heldout  # chance: 0.5

    grpo = [json.loads(line) for line in (out / "grpo" / "run" / "metrics.jsonl").read_text().splitlines()]
    rule = [r["rollout/reward/rule_mean"] for r in grpo]
    assert len(rule) == 12 and all("rollout/reward/rm_mean" in r for r in grpo)
    assert {"rm.png", "grpo.png", "dpo.png", "summary.md"} <= {p.name for p in out.iterdir()}
    assert (out / "dpo" / "hf" / "step_4" / "config.json").exists()
    assert all((out / "rm" / f"round_{k}" / "hf" / "config.json").exists() for k in range(3))
    onpolicy = [r for r in results if "/onpolicy_" in r.get("pairs_file", "")]
    assert len(onpolicy) == 2 and all(r["pairs"] > 0 for r in onpolicy), onpolicy
    # Trained on the reward models' scores alone, the rule reward must rise. Judged on the evaluation (128 samples
    # of 32 held-out prompts per policy) of the start and of the last GRPO round; the training steps' own means
    # swing by ~0.2 from one step to the next at this size (a quiet-machine run: steps 0.09 0.08 0.09 ... 0.04
    # 0.08 0.27 0.21, last three 0.18 against the first three's 0.09, while its evaluation went 0.09 -> 0.30),
    # so for them only the second half above the first.
    evaluated = {Path(r["model"]).relative_to(out).as_posix(): r["rule_reward"] for r in results if "rule_reward" in r}
    start, trained = evaluated["model"], evaluated["grpo/hf/round_3"]
    assert trained > start + 0.15, evaluated
    assert sum(rule[6:]) > sum(rule[:6]), rule
