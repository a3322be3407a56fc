"""transformers float32 references for the Megatron integration tests."""

from __future__ import annotations

import torch


def sample_sequences(model, num: int, seed: int, vocab_size: int) -> tuple[list[list[int]], list[int]]:
    """Random prompts (3-8 tokens) continued by sampling from `model` (4-20 tokens, temperature 1):
    the tokens an RL rollout would score. Returns (token ids, response start per sequence)."""
    gen = torch.Generator().manual_seed(seed)
    sequences, starts = [], []
    for _ in range(num):
        prompt_len = int(torch.randint(3, 9, (1,), generator=gen))
        response_len = int(torch.randint(4, 21, (1,), generator=gen))
        tokens = torch.randint(0, vocab_size, (prompt_len,), generator=gen).tolist()
        with torch.no_grad():
            for _ in range(response_len):
                logits = model(torch.tensor([tokens])).logits[0, -1].float()
                tokens.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)))
        sequences.append(tokens)
        starts.append(prompt_len)
    return sequences, starts


def reference_log_probs(model, sequences: list[list[int]], starts: list[int]):
    """transformers float32: per sequence (log p(token_j) for j >= start, entropy at those positions)."""
    out = []
    with torch.no_grad():
        for tokens, start in zip(sequences, starts):
            log_softmax = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)
            positions = torch.arange(start - 1, len(tokens) - 1)
            log_probs = log_softmax[positions, torch.tensor(tokens[start:])]
            entropy = -(log_softmax.exp() * log_softmax).sum(-1)[positions]
            out.append((log_probs, entropy))
    return out
