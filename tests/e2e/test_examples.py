"""The multi-turn examples as a user runs them: each example's own launch script (examples/*/run.sh),
with MODEL= the tiny model and no warm start, for a few training steps. What is checked is the
machinery (turns, masks, the environment's rewards reaching the trainer), not learning: that is
test_agent_examples_learn.py, on SmolLM2-135M-Instruct as the READMEs run it."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

# each run's own deadline (900 s) and the set-up beside it, beyond slow_tiers' default --timeout=900
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

SMALL = ("--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--micro-batch-size", "4",
         "--dump-samples-interval", "1", "--no-tensorboard")


def run_example(name: str, out: Path, *flags: str) -> list[dict]:
    model = out / "model"
    subprocess.run([str(REPO / ".venv/bin/python"), "-m", "lean_rl.testing.tiny_model", "--out", str(model),
                    "--arch", "qwen2", "--preset", "tiny", "--seed", "0"], cwd=REPO, check=True, capture_output=True)
    env = {**os.environ, "OUT": str(out), "MODEL": str(model), "WARM_START_STEPS": "0"}
    result = subprocess.run(["bash", f"examples/{name}/run.sh", *SMALL, *flags], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert (out / "run" / "curves.png").stat().st_size > 10_000
    return [json.loads(line) for step in (0, 1)
            for line in (out / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def check_trajectories(samples: list[dict]) -> None:
    assert len(samples) == 8
    for s in samples:
        turns = s["metadata"]["turns"]
        assert 1 <= len(turns) <= 4 and s["reward"] in (0.0, 1.0)
        # the model's tokens, and only those, are trained on
        assert sum(s["loss_mask"]) == sum(t["output_tokens"] for t in turns)
        prompt_length = len(s["tokens"]) - s["response_length"]
        assert [t["input_tokens"] for t in turns][0] == prompt_length
        assert all(t["engine_prompt_tokens"] == t["input_tokens"] for t in turns)


# slow (suite time, issue 24): the default agent runs are the OpenAI-API agent example (test_example_openai_agent.py)
# and slime's search agent (test_slime_compat_run.py); tool-call parsing and masking are in
# tests/integration/test_rollout.py::test_custom_generate_masks_tool_tokens and tests/unit
@pytest.mark.slow
def test_tool_calling_example_trains(tmp_path):
    samples = run_example("tool_calling", tmp_path)
    check_trajectories(samples)
    assert all("<tool_call>" in s["prompt"][0]["content"] for s in samples)  # the call format was described


# slow (suite time, issue 24): the default agent example is the tool-calling one above
@pytest.mark.slow
def test_search_env_example_trains(tmp_path):
    samples = run_example("search_env", tmp_path)
    check_trajectories(samples)
    multi = [s for s in samples if len(s["metadata"]["turns"]) > 1]
    # only a search goes on (its results, not trained on); a turn with neither tag ends the episode
    assert all("<result>" in s["response"] for s in multi)
