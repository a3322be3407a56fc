"""slime.rollout.rm_hub.f1: SQuAD-style token F1 (answers normalised: lower case, no punctuation or
articles)."""

from __future__ import annotations

import collections
import re
import string


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_score(prediction, ground_truth) -> tuple[float, float, float]:
    """(f1, precision, recall) of the prediction's tokens against the ground truth's."""
    if prediction is None:
        return 0.0, 0.0, 0.0
    pred, gold = normalize_answer(prediction), normalize_answer(str(ground_truth))
    if pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer"):
        if pred != gold:
            return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    overlap = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0, 0.0, 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall
