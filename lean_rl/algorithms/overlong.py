"""DAPO's over-long reward shaping and filtering (Yu et al. 2025, "DAPO", sec. 3.4; verl's
`reward_model.overlong_buffer`, NeMo RL's `overlong_filtering`).

Soft over-long punishment: with L_max the response budget (--rollout-max-response-len) and L_cache the
buffer (--overlong-buffer-len), a response of |y| tokens gets, added to its reward,
    0                                            |y| <= L_max - L_cache
    (L_max - L_cache - |y|) / L_cache * factor   L_max - L_cache < |y| <= L_max
    -factor                                      |y| > L_max
factor being --overlong-penalty-factor (DAPO: 1). Over-long filtering (--overlong-filtering): a
response cut off by the budget (TRUNCATED) is not trained on (its loss mask becomes 0); its reward still
counts in its group's statistics, as NeMo RL and DAPO's token-level masking do."""

from __future__ import annotations


def overlong_penalty(response_length: int, max_response_len: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """The (non-positive) reward added to a response of `response_length` tokens."""
    if buffer_len <= 0 or buffer_len > max_response_len:
        raise ValueError(f"--overlong-buffer-len must be in (0, --rollout-max-response-len {max_response_len}], "
                         f"got {buffer_len}")
    if response_length > max_response_len:
        return -penalty_factor
    return min((max_response_len - buffer_len - response_length) / buffer_len * penalty_factor, 0.0)
