"""A tiny HF sequence-classification reward model (one label, random weights) for tests of the reward
engines: a tiny causal model of lean_rl.testing.tiny_model with a score head in place of its LM head,
saved by transformers (so its class is transformers' own: Qwen2ForSequenceClassification, ...)."""

from __future__ import annotations

from pathlib import Path


def make_tiny_reward_model(out: str | Path, base: str | Path, seed: int = 1) -> Path:
    """`base`'s body with a seeded 1-label score head, saved with `base`'s tokenizer under `out` (once)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1, dtype=torch.float32)
    with torch.no_grad():  # a head large enough that different texts score visibly apart
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(out)
    return out
