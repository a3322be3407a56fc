"""Training on preference pairs as a user runs it, no engines (python -m lean_rl.train on the tiny model):
DPO (--loss-type dpo_loss) raises the chosen-rejected margin against the frozen reference, and a reward
model (--loss-type rm_loss) lowers its Bradley-Terry loss and saves a checkpoint that converts to
Qwen2ForSequenceClassification, which transformers loads and which prefers the chosen responses."""

import json
import subprocess
import sys

import pytest
import torch
import transformers

from tests.e2e.conftest import REPO, read_metrics, run_lean_rl


def write_pairs(path, n):
    """The toy preference: the answer in the kind the prompt asks for is the chosen one."""
    rows = []
    for i in range(n):
        kind = "digits" if i % 2 else "letters"
        good, bad = ("1 2 3 4", "a b c d") if kind == "digits" else ("a b c d", "1 2 3 4")
        rows.append({"question": f"answer in {kind}: item {i}", "good": good, "bad": bad})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def pair_flags(model, data, out, loss_type, *extra):
    return ["--hf-checkpoint", str(model), "--output-dir", str(out / "run"), "--no-tensorboard",
            "--prompt-data", str(data), "--input-key", "question", "--chosen-key", "good", "--rejected-key", "bad",
            "--rollout-shuffle", "--loss-type", loss_type, "--n-samples-per-prompt", "2", "--rollout-batch-size", "8",
            "--micro-batch-size", "4", "--lr-decay-style", "constant", *extra]


@pytest.mark.slow  # ~2.5 min on 2 cores: Ray and the trainer start, no engines
def test_dpo_raises_the_margin_of_the_tiny_model(tmp_path, tiny_qwen2):
    data = tmp_path / "pairs.jsonl"
    write_pairs(data, 64)
    done = run_lean_rl("lean_rl.train", pair_flags(tiny_qwen2, data, tmp_path, "dpo_loss", "--num-rollout", "5",
                                                   "--lr", "1e-4", "--dpo-beta", "0.1"), timeout_s=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = read_metrics(tmp_path)
    losses, margins = [r["train/dpo_loss"] for r in rows], [r["train/dpo_margin"] for r in rows]
    print(f"\ndpo_loss {[round(x, 4) for x in losses]}; margin {[round(x, 4) for x in margins]}")
    assert losses[0] == pytest.approx(0.6931, abs=1e-4) and margins[0] == pytest.approx(0.0, abs=1e-5)  # policy == ref
    assert all(b > a for a, b in zip(margins, margins[1:])), margins  # every step widens it
    assert losses[-1] < losses[0] - 0.05 and rows[-1]["train/dpo_accuracy"] == 1.0
    assert "engines" not in {p.name for p in (tmp_path / "run").iterdir()}  # no engine was started


@pytest.mark.slow  # ~3 min on 2 cores: Ray and the trainer start, a checkpoint, a conversion
def test_reward_model_run_saves_a_checkpoint_transformers_scores(tmp_path, tiny_qwen2):
    data = tmp_path / "pairs.jsonl"
    rows = write_pairs(data, 64)
    done = run_lean_rl("lean_rl.train", pair_flags(tiny_qwen2, data, tmp_path, "rm_loss", "--num-rollout", "6",
                                                   "--lr", "1e-3", "--save", str(tmp_path / "ckpt"),
                                                   "--save-interval", "6"), timeout_s=900)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = read_metrics(tmp_path)
    losses, margins = [r["train/rm_loss"] for r in metrics], [r["train/rm_margin"] for r in metrics]
    print(f"\nrm_loss {[round(x, 4) for x in losses]}; margin {[round(x, 4) for x in margins]}")
    assert losses[-1] < losses[0] - 0.05 and margins[-1] > margins[1] > 0, (losses, margins)

    converted = subprocess.run([sys.executable, "-m", "lean_rl.convert", "megatron-to-hf", "--load",
                                str(tmp_path / "ckpt"), "--save", str(tmp_path / "hf"), "--hf-config", str(tiny_qwen2)],
                               cwd=REPO, capture_output=True, text=True, timeout=300)
    assert converted.returncode == 0, converted.stderr
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")

    def score(prompt, response):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] + tokenizer(response, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, 0].item()

    preferred = [score(r["question"], r["good"]) > score(r["question"], r["bad"]) for r in rows[:16]]
    assert sum(preferred) >= 14, preferred
