"""On-policy distillation as a user runs it: `python -m lean_rl.train --use-opd --opd-type sglang
--opd-teacher-hf-checkpoint T` with no task reward, the teacher a tiny model of another seed (the same
tokenizer) served by the run's own second engine group. The student's reverse KL to the teacher,
measured on its own samples every step, falls; the teacher's log-probs the rollout stored are the
teacher's (checked against transformers)."""

import json

import pytest
from conftest import read_metrics, run_flags, run_lean_rl

pytestmark = pytest.mark.e2e

STEPS = 12
# measured (2 cores): the mean of the first three steps ~10.2 nats/token. Sampling on CPU is not
# reproducible run to run (which requests share a batch depends on timing), and the per-token k1 penalty
# drifts back up on some runs: the mean of the last three steps was ~0.69 of the first three's in two
# runs, 0.56 and 0.92 in two later ones, whose lowest points in the second half were 0.52 and 0.78. The same run with the penalty's sign flipped
# climbs to ~19 instead.
MAX_RATIO = 0.85


def _teacher_log_probs_by_transformers(teacher, samples):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32)
    out = []
    for s in samples:
        ids = torch.tensor([s["tokens"]])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append(log_probs[len(log_probs) - s["response_length"]:].tolist())
    return out


def test_student_reverse_kl_to_the_teacher_falls(tiny_qwen2, tiny_model_factory, toy_data, tmp_path):
    teacher = tiny_model_factory("qwen2", seed=1)
    flags = run_flags(tiny_qwen2, toy_data, tmp_path, "--num-rollout", str(STEPS), "--lr", "2e-3",
                      "--use-opd", "--opd-type", "sglang", "--opd-teacher-hf-checkpoint", str(teacher),
                      "--opd-kl-coef", "1",
                      "--save-debug-rollout-data", str(tmp_path / "rollouts" / "{rollout_id}.jsonl"))
    at = flags.index("--custom-rm-path")
    del flags[at:at + 2]  # no task reward: pure distillation
    result = run_lean_rl("lean_rl.train", flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["rollout/reward_mean"] == 0 and r["rollout/failed_samples"] == 0 for r in rows)
    assert all(r["rollout/teacher_seconds"] > 0 for r in rows)
    kl = [r["train/opd_reverse_kl"] for r in rows]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    assert first > 1 and min(kl[STEPS // 2:]) < MAX_RATIO * first and last < first, [round(x, 2) for x in kl]
    # what the teacher's engines returned is the teacher's log p of each response token
    samples = [s for line in (tmp_path / "rollouts" / "0.jsonl").read_text().splitlines() for s in json.loads(line)]
    assert len(samples) == 64
    expected = _teacher_log_probs_by_transformers(teacher, samples)
    for s, want in zip(samples, expected):
        assert len(s["teacher_log_probs"]) == s["response_length"]
        assert max(abs(a - b) for a, b in zip(s["teacher_log_probs"], want)) < 1e-4
