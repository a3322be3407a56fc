"""DPO (--loss-type dpo_loss) with real Megatron in Ray rank actors: the two sequences of a pair are laid
out in micro-batches and data-parallel ranks independently (train_batches.py sorts by length), and the
per-row coefficients (algorithms/preference.py) make the step's gradient the pair loss's all the same:
data-parallel size 2 follows size 1's loss curve, and the margin widens every step."""

from __future__ import annotations

import pytest
import transformers
from training_helpers import train_config

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.options import build
from lean_rl.rollout.preference import CHOSEN, REJECTED, fill_pair_sample, response_tokens
from lean_rl.sample import Sample

pytestmark = pytest.mark.integration


def dpo_groups(tokenizer, count: int) -> list[list[Sample]]:
    groups = []
    for g in range(count):
        kind = "digits" if g % 2 else "letters"
        good, bad = ("1 2 3 4", "a b c d e f") if kind == "digits" else ("a b c", "1 2 3 4 5")  # unequal lengths
        prompt = tokenizer(f"answer in {kind}: item {g}", add_special_tokens=False)["input_ids"]
        group = []
        for k, (text, mark) in enumerate(((good, CHOSEN), (bad, REJECTED))):
            sample = Sample(index=2 * g + k, group_index=g, prompt="p", tokens=list(prompt))
            fill_pair_sample(sample, prompt, response_tokens(tokenizer, text, eos=True), mark, score_only=False,
                             placeholder=tokenizer.eos_token_id)
            group.append(sample)
        groups.append(group)
    return groups


def _curve(checkpoint, world_size: int, groups) -> list[dict]:
    algo = build(AlgorithmConfig, loss_type="dpo_loss", dpo_beta=0.1)
    with MegatronGroup.from_hf_checkpoint(checkpoint, ParallelConfig(), world_size=world_size) as group:
        initialize_for_training(group, train_config(checkpoint, lr=1e-4, micro_batch_size=2), algo)
        return [train_on_rollout(group, groups, policy_version=step) for step in range(4)]


@pytest.mark.slow  # ~2 min: a one-rank and a two-rank group, four steps each
def test_dpo_at_data_parallel_2_follows_data_parallel_1(ray_cluster, tiny_qwen2):
    groups = dpo_groups(transformers.AutoTokenizer.from_pretrained(tiny_qwen2), 8)
    one, two = _curve(tiny_qwen2, 1, groups), _curve(tiny_qwen2, 2, groups)
    losses = [m["train/dpo_loss"] for m in two]
    margins = [m["train/dpo_margin"] for m in two]
    print(f"\nDP=2 dpo_loss {[round(x, 5) for x in losses]}; margin {[round(x, 5) for x in margins]}")
    assert losses[0] == pytest.approx(0.6931, abs=1e-4)  # policy == reference
    assert all(b > a for a, b in zip(margins, margins[1:])), margins
    assert losses == pytest.approx([m["train/dpo_loss"] for m in one], abs=1e-5)
    assert margins == pytest.approx([m["train/dpo_margin"] for m in one], abs=1e-4)
