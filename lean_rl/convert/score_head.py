"""A reward model's checkpoint (--loss-type rm_loss: the policy's trunk with a value head, hidden -> 1,
stored as `value_head.weight` by backends/megatron/value_head.py) in HF's sequence-classification form:
the trunk's tensors as for the causal LM, no lm_head, and `score.weight` [1, hidden]; config.json's
architectures become *ForSequenceClassification with num_labels 1. transformers (and SGLang's reward
models) score a text by the head at its last token, as the trainer did."""

from __future__ import annotations

from typing import Any

SCORE_KEY = "value_head.weight"  # the stored name of the head (ValueHead.sharded_state_dict)
HF_SCORE = "score.weight"
OUTPUT_LAYER = "output_layer.weight"


def is_reward_model(stored_keys) -> bool:
    return SCORE_KEY in stored_keys


def without_output_layer(rules: tuple) -> tuple:
    """The family's weight rules less the vocabulary projection, which a reward model does not have."""
    return tuple(rule for rule in rules if rule.megatron != OUTPUT_LAYER)


def classification_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json of the sequence-classification class of the same family (one label, the score)."""
    architectures = config.get("architectures") or []
    causal = [name for name in architectures if name.endswith("ForCausalLM")]
    if not causal:
        raise ValueError(f"config.json names architectures {architectures}: no *ForCausalLM to turn into its "
                         "*ForSequenceClassification (a reward model converts from the causal LM it was trained from)")
    named = [name.removesuffix("ForCausalLM") + "ForSequenceClassification" for name in causal]
    out = {key: value for key, value in config.items() if key not in ("id2label", "label2id")}
    out.update(architectures=named, num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    return out
