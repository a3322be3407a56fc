"""slime.rollout.rm_hub.math_dapo_utils: DAPO's score (the answer after the last "Answer:")."""

from __future__ import annotations

import re

_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def _normalize(text: str) -> str:
    text = text.strip().strip("$").strip().rstrip(".").strip()
    return re.sub(r"\s+", "", text.replace("\\boxed{", "").rstrip("}") if text.startswith("\\boxed{") else text)


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  pause_tokens_index=None) -> dict:
    """{"score": 1.0 or -1.0, "acc": bool, "pred": str}: the last "Answer: X" of the response's last
    300 characters against the ground truth, compared after normalising spaces, $ and a final ".".
    strict_box_verify: the last \\boxed{} instead."""
    tail = solution_str[-300:]
    if strict_box_verify:
        from lean_rl.rollout.rewards import last_boxed

        pred = last_boxed(tail) or ""
    else:
        matches = _ANSWER.findall(tail)
        pred = matches[-1] if matches else ""
    correct = bool(pred) and _normalize(pred) == _normalize(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred.strip()}
