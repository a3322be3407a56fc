"""slime's way in, whole runs: a launch script in slime's style (scripts/run-slime-style-tiny.sh, 60+
of slime's flags) trains the tiny model through python -m lean_rl.slime_launch, and slime's SFT
stage (--loss-type sft_loss) lowers the tiny model's loss on conversations, with no engines."""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, read_metrics, run_lean_rl


@pytest.mark.slow  # ~3 min on 2 cores: engines, router and trainer start
def test_slime_style_script_trains_the_tiny_model(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PY": sys.executable}
    done = subprocess.run(["bash", "scripts/run-slime-style-tiny.sh", "--num-rollout", "2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0 <= r["rollout/reward_mean"] <= 1 for r in rows)
    # the tuning flags were accepted with their one-line notices
    assert "slime flag --recompute-granularity accepted, no effect here" in done.stderr
    assert "slime flag --context-parallel-size accepted" in done.stderr


def _chats(path, n):
    rows = []
    for i in range(n):
        kind = "digits" if i % 2 else "letters"
        answer = "1 2 3 4" if kind == "digits" else "a b c d"
        rows.append({"messages": [{"role": "user", "content": f"answer in {kind}: item {i}"},
                                  {"role": "assistant", "content": answer}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_sft_lowers_the_loss_of_the_tiny_model(tmp_path, tiny_qwen2):
    """slime's retool SFT flags (through slime_launch): no engines start, and the negative
    log-likelihood of the assistant turns falls over 4 steps."""
    data = tmp_path / "chats.jsonl"
    _chats(data, 32)
    flags = ["train_async.py", "--hf-checkpoint", str(tiny_qwen2), "--output-dir", str(tmp_path / "run"),
             "--no-tensorboard", "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
             "--prompt-data", str(data), "--input-key", "messages", "--rollout-shuffle", "--num-rollout", "4",
             "--rollout-batch-size", "8", "--global-batch-size", "8", "--loss-type", "sft_loss",
             "--calculate-per-token-loss", "--disable-compute-advantages-and-returns", "--debug-train-only",
             "--optimizer", "adam", "--lr", "1e-3", "--lr-decay-style", "constant", "--weight-decay", "0.0",
             "--recompute-granularity", "full", "--micro-batch-size", "8"]
    done = run_lean_rl("lean_rl.slime_launch", flags, timeout_s=600)
    assert done.returncode == 0, done.stderr[-4000:]
    losses = [r["train/sft_loss"] for r in read_metrics(tmp_path)]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert "engines" not in {p.name for p in (tmp_path / "run").iterdir()}  # no engine was started
