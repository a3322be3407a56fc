"""A reward model trained with real Megatron at TP=2 and at PP=2 (two Ray rank actors over gloo, --loss-type rm_loss):
the Bradley-Terry loss falls and the chosen-rejected margin rises on preference pairs; its checkpoint
converts (python -m lean_rl.convert megatron-to-hf) to Qwen2ForSequenceClassification, which transformers
loads and whose score of each text equals the trainer's to 1e-4 in float32."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from training_helpers import train_config

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.rollout_batch import rollout_batch
from lean_rl.backends.megatron.train_driver import forward_rollout, train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.options import build
from lean_rl.rollout.preference import CHOSEN, REJECTED, fill_pair_sample, response_tokens
from lean_rl.sample import Sample

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def pair_groups(tokenizer, count: int) -> list[list[Sample]]:
    """Pairs of the toy preference: the answer in the kind the prompt asks for is the chosen one."""
    groups = []
    for g in range(count):
        kind = "digits" if g % 2 else "letters"
        good, bad = ("1 2 3 4", "a b c d") if kind == "digits" else ("a b c d", "1 2 3 4")
        prompt = tokenizer(f"answer in {kind}: item {g}", add_special_tokens=False)["input_ids"]
        group = []
        for k, (text, mark) in enumerate(((good, CHOSEN), (bad, REJECTED))):
            sample = Sample(index=2 * g + k, group_index=g, prompt="p", tokens=list(prompt))
            fill_pair_sample(sample, prompt, response_tokens(tokenizer, text, eos=False), mark, score_only=True,
                             placeholder=tokenizer.eos_token_id)
            group.append(sample)
        groups.append(group)
    return groups


@pytest.mark.slow  # ~1.5 min each: two rank actors, six optimizer steps, a conversion
@pytest.mark.parametrize("parallel", [ParallelConfig(tensor_model_parallel_size=2),
                                      ParallelConfig(pipeline_model_parallel_size=2)], ids=["tp2", "pp2"])
def test_reward_model_trains_and_converts_to_hf_sequence_classification(parallel, ray_cluster, tiny_qwen2, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qwen2)
    groups = pair_groups(tokenizer, 8)
    algo = build(AlgorithmConfig, loss_type="rm_loss")
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, parallel, world_size=2) as group:
        initialize_for_training(group, train_config(tiny_qwen2, lr=1e-3, micro_batch_size=4), algo)
        metrics = [train_on_rollout(group, groups, policy_version=step) for step in range(6)]
        batch = rollout_batch(groups)
        trainer_scores = forward_rollout(group, batch)[:, 0]  # the value at each text's last token
        group.save_checkpoint(tmp_path / "ckpt", 6)
    losses = [m["train/rm_loss"] for m in metrics]
    margins = [m["train/rm_margin"] for m in metrics]
    print(f"\n{parallel}: rm_loss {[round(x, 4) for x in losses]}; margin {[round(x, 4) for x in margins]}")
    assert losses[0] == pytest.approx(0.6931, abs=1e-3)  # the head starts at zero: every score is 0
    assert losses[-1] < losses[0] - 0.05 and margins[-1] > margins[1] > 0, (losses, margins)
    assert metrics[-1]["train/rm_accuracy"] == 1.0

    done = subprocess.run([sys.executable, "-m", "lean_rl.convert", "megatron-to-hf", "--load", str(tmp_path / "ckpt"),
                           "--save", str(tmp_path / "hf"), "--hf-config", str(tiny_qwen2)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(model).__name__ == "Qwen2ForSequenceClassification" and model.config.num_labels == 1
    model.eval()
    with torch.no_grad():
        hf_scores = torch.tensor([model(torch.tensor([s.tokens[:-1]])).logits[0, 0].item()
                                  for g in groups for s in g])  # the text, without the trainer's placeholder
    print(f"max |HF score - trainer score| {float((hf_scores - trainer_scores).abs().max()):.2e}")
    assert torch.allclose(hf_scores, trainer_scores, atol=1e-4), (hf_scores, trainer_scores)
    assert (hf_scores[0::2] > hf_scores[1::2]).all()  # the converted model prefers every chosen response
