"""pass@k of an evaluation set: the probability that at least one of k samples drawn without
replacement from a prompt's n is correct, estimated without bias from the c correct ones among the n
(Chen et al., 2021, "Evaluating Large Language Models Trained on Code", eq. 1):

    pass@k = 1 - C(n - c, k) / C(n, k),   averaged over the prompts.

Which k: --eval-pass-k (every set) or a set's `pass_k` key in --eval-config, else 1 and n."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from lean_rl.options import ConfigError

# a sample passes when its reward reaches this (rule rewards are 0/1; a partial-credit reward passes only at full credit)
PASS_REWARD = 1.0


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from n samples with `correct` successes. ValueError for k outside 1..n or a
    count outside 0..n (a bad k never becomes a number)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n, the samples per prompt ({n})")
    if not 0 <= correct <= n:
        raise ValueError(f"pass@k: {correct} correct of {n} samples")
    if n - correct < k:  # every draw of k holds a correct one (C(n-c, k) = 0)
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def mean_pass_at_k(correct_per_prompt: Sequence[int], n: int, k: int) -> float:
    """pass@k of a set whose prompts had `n` attempts each, `correct_per_prompt[i]` of them correct."""
    if not correct_per_prompt:
        raise ValueError("pass@k of a set with no prompts")
    return sum(pass_at_k(n, c, k) for c in correct_per_prompt) / len(correct_per_prompt)


def ks_of(given: Iterable[int], n: int, where: str) -> tuple[int, ...]:
    """The k's to report for a set of n samples per prompt: `given` (checked), else 1 and n. A k
    outside 1..n is a ConfigError naming `where` (the flag, or the set of --eval-config)."""
    given = tuple(given)
    for k in given:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
            raise ConfigError(f"{where}: pass@k needs an integer k with 1 <= k <= n_samples_per_eval_prompt ({n}), "
                              f"got {k!r}: lower k or draw more samples per prompt")
    return tuple(sorted(set(given))) if given else tuple(sorted({1, n}))
