"""A slime user's functions trained by lean_rl with their files unchanged (issue 25): a search-style
multi-turn generate written against slime's API (tests/e2e/slime_style/search_agent.py: `from
slime.utils.types import Sample`, GenerateState, slime.utils.http_utils.post, a dict reward), slime's
dynamic filter from its filter_hub, a slime reward post-process and a slime custom loss; and a slime
rollout function over slime's data source with slime's advantage and TIS functions
(tests/e2e/slime_style/multi_agent_rollout.py); served by lean_rl/slime_compat, 3 steps of the tiny
model each with real SGLang, router, Megatron and Ray."""

import json
import os

import pytest
from conftest import REPO, read_metrics, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e

STEPS = 3
SLIME_STYLE = REPO / "tests" / "e2e" / "slime_style"


def slime_run(tiny_qwen2, toy_data, tmp_path, *extra):
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--colocate", "--num-rollout", str(STEPS),
                      "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--dump-samples-interval", "1",
                      "--custom-generate-function-path", "search_agent.generate",
                      "--custom-rm-path", "search_agent.reward", "--reward-key", "score",
                      "--dynamic-sampling-filter-path",
                      "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
                      "--custom-reward-post-process-path", "search_agent.reward_post_process",
                      "--loss-type", "custom_loss", "--custom-loss-function-path", "search_agent.ppo_loss", *extra)
    env = {"PYTHONPATH": os.pathsep.join([str(SLIME_STYLE), str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_lean_rl("lean_rl.train", flags, extra_env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    samples = [[json.loads(line) for line in
                (tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
               for step in range(STEPS)]
    return rows, samples


def test_a_slime_search_agent_trains_unchanged(tiny_qwen2, toy_data, tmp_path):
    rows, samples = slime_run(tiny_qwen2, toy_data, tmp_path)
    assert all(r.get("rollout/generate_failed", 0) == 0 and r.get("rollout/reward_failed", 0) == 0 for r in rows)
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)  # trained weights reached the engines
    for step, trained in enumerate(samples):
        assert len(trained) == 16
        for s in trained:
            mask, versions = s["loss_mask"], s["weight_versions"]
            # two turns of the model with the search result between them, not trained on
            assert 0 in mask and mask[0] == 1 and mask[-1] == 1
            assert "<information>" in s["response"]
            # per-token versions filled exactly from the answers the compat post saw: this step's policy
            assert {v for v, m in zip(versions, mask) if m} == {step}
            assert all(v == -1 for v, m in zip(versions, mask) if not m)
            assert s["status"] in ("completed", "truncated")
            assert s["metadata"]["rewards"]["turns"] == 2.0  # the dict reward; "score" was trained
            assert s["reward"] == s["metadata"]["rewards"]["score"]
            assert s["metadata"]["slime_attributes"]["turns"] == 2  # the agent's own attribute, kept
    # the slime reward post-process ran on every step (train_hooks records the raw rewards it replaced)
    assert all(0.0 <= r["train/raw_reward_mean"] <= 1.0 for r in rows)
    # slime's loss contract trained every step: its own metric, one per micro-batch
    assert all(r["train/search_agent_loss_calls"] >= 1.0 for r in rows)


# slow (suite time, issue 24): a second 3-step run; the default suite keeps the search agent's run above
# (a slime file unchanged, through to training) and this rollout function against real engines
# (tests/integration/test_rollout.py::test_a_slime_rollout_function_over_slimes_data_source_fills_the_buffer);
# slime's advantage and TIS contracts equal the built-ins (tests/unit/test_slime_contracts.py)
@pytest.mark.slow
def test_a_slime_rollout_function_with_slime_trainer_hooks_trains_unchanged(tiny_qwen2, toy_data, tmp_path):
    """slime's rollout-function contract (its data source, a multi-agent fan-out, RolloutFnTrainOutput),
    slime's advantage contract and slime's TIS contract, all from one unchanged file."""
    custom = tmp_path / "agents.yaml"
    custom.write_text("agent_tokens: 6\n")
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--colocate", "--num-rollout", str(STEPS),
                      "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--dump-samples-interval", "1",
                      "--micro-batch-size", "4", "--rollout-function-path", "multi_agent_rollout.generate_rollout",
                      "--custom-advantage-function-path", "multi_agent_rollout.advantages",
                      "--use-tis", "--custom-tis-function-path", "multi_agent_rollout.tis",
                      "--custom-config-path", str(custom))
    env = {"PYTHONPATH": os.pathsep.join([str(SLIME_STYLE), str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = run_lean_rl("lean_rl.train", flags, extra_env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    for step, row in enumerate(rows):
        trained = [json.loads(line) for line in
                   (tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        # two prompts, two samples each, each fanned out to a solver and a reviewer
        assert len(trained) == 8 and sum(s["index"] >= 1_000_000 for s in trained) == 4
        for s in trained:
            assert {v for v, m in zip(s["weight_versions"], s["loss_mask"]) if m} == {step}
        reviewers = [s for s in trained if s["index"] >= 1_000_000]
        assert all(s["prompt"].endswith("\nAgain:") for s in reviewers)
        # the advantage function's reward - mean(reward), token-weighted, is what was trained
        rewards = [s["reward"] for s in trained]
        mean = sum(rewards) / len(rewards)
        tokens = [sum(s["loss_mask"]) for s in trained]
        expected = sum((r - mean) * n for r, n in zip(rewards, tokens)) / sum(tokens)
        assert row["rollout/advantage_mean"] == pytest.approx(expected, abs=1e-5)
        assert row["multi_agent/agents_per_sample"] == 2.0
        # the TIS function ran in the loss (its metric), engine and trainer agreeing on fp32 CPU
        assert row["train/slime_tis_ratio"] == pytest.approx(1.0, abs=0.05)
    assert all(r["sync/probe_max_abs_diff"] < 1e-3 for r in rows)
