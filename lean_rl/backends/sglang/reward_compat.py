"""SGLang patch for reward models served from HF sequence-classification checkpoints (the run's
reward engines, --rm-hf-checkpoint), applied in the server process by launch.py.

sglang/srt/models/qwen2_classification.py:46 and qwen3_classification.py:136 build the score head as
`nn.Linear(hidden, num_labels)`, with a bias, where transformers' Qwen2/Qwen3ForSequenceClassification
have none (bias=False): the checkpoint holds no `score.bias`, SGLang's load_weights leaves it as
initialised, and every score is off by that constant (measured on a tiny Qwen2: 0.058 served against
transformers' 0.037 for the same tokens). After loading, a bias the checkpoint did not hold is zeroed:
the head is then transformers' one.
"""

from __future__ import annotations

import functools


def zero_missing_score_bias() -> None:
    from sglang.srt.models.qwen2_classification import Qwen2ForSequenceClassification
    from sglang.srt.models.qwen3_classification import Qwen3ForSequenceClassification

    for cls in (Qwen2ForSequenceClassification, Qwen3ForSequenceClassification):
        if getattr(cls.load_weights, "_lean_rl_patched", False):
            continue

        def patched(self, weights, _load=cls.load_weights):
            weights = list(weights)  # read twice: the names here, the tensors in SGLang's loader
            result = _load(self, weights)
            bias = getattr(self.score, "bias", None)
            if bias is not None and not any(name.endswith("score.bias") for name, _ in weights):
                bias.data.zero_()
            return result

        patched._lean_rl_patched = True  # type: ignore[attr-defined]
        setattr(cls, "load_weights", functools.wraps(cls.load_weights)(patched))  # noqa: B010 - mypy: no method assignment
