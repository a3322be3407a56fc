"""LoRA on the actor with real Megatron ranks over gloo (DP = 2, the distributed optimizer): only the
adapters train, as many elements as counted by hand; the adapted model starts as the base model
exactly; training lowers the loss and leaves every base weight bit for bit; the exported (synced)
weight is W + alpha / rank * B A; a resumed run continues with the same adapters and optimizer state."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from training_helpers import fixed_old_policy, make_groups, set_rollout_log_probs, train_config

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup, MegatronGroupError
from lean_rl.backends.megatron.hf_weights.checkpoint import HFCheckpoint
from lean_rl.backends.megatron.lora_config import LoraConfig
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.convert.dcp_io import DistCheckpointReader
from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf
from lean_rl.options import build

pytestmark = pytest.mark.integration
RANK, ALPHA = 4, 8.0  # scaling 2
# the tiny Qwen2 (lean_rl.testing.tiny_model): hidden 64, ffn 256, 2 layers, 4 heads of 16, 2 KV groups
HIDDEN, FFN, LAYERS, QKV_ROWS = 64, 256, 2, (4 + 2 * 2) * 16


def _train(checkpoint, distributed_optimizer=True, **kwargs):
    return replace(train_config(checkpoint, lr=1e-2, distributed_optimizer=distributed_optimizer, **kwargs),
                   lora=build(LoraConfig, lora_rank=RANK, lora_alpha=ALPHA))


def _model_tensors(directory) -> dict[str, torch.Tensor]:
    reader = DistCheckpointReader(directory)
    return {key: reader.read(key, (0,) * len(meta.size), tuple(meta.size))
            for key, meta in reader.tensors().items() if key.startswith(("embedding.", "decoder.", "output_layer."))}


# slow (suite time): tests/e2e/test_lora_run.py syncs only the adapters by default, and its probe every step
# (engine base + adapter vs trainer) fails if anything but the adapters trained
@pytest.mark.slow
def test_lora_trains_only_the_adapters_and_exports_merged_weights(ray_cluster, tiny_qwen2, tmp_path):
    groups = make_groups(seed=4)
    probe = [s.tokens for g in groups for s in g][:3]
    algo = fixed_old_policy()
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=2) as group:  # DP = 2
        base_logits = group.compute_logits(probe)
        base_hf = group.gather_hf_state_dict()
        initialize_for_training(group, _train(tiny_qwen2), algo)

        # (a) what trains: A [r, in] and B [out, r] of the four linear layers of every layer
        trainable = group.trainable_parameters()
        assert all(name.endswith((".lora.a", ".lora.b")) for name in trainable), sorted(trainable)
        by_hand = LAYERS * RANK * ((HIDDEN + QKV_ROWS) + (HIDDEN + HIDDEN) + (HIDDEN + 2 * FFN) + (FFN + HIDDEN))
        assert len(trainable) == LAYERS * 4 * 2 and sum(trainable.values()) == by_hand == 9728

        # (b) B = 0: the adapted model is the base model, to the bit, and exports the base weights
        assert all(torch.equal(a, b) for a, b in zip(group.compute_logits(probe), base_logits))
        assert all(torch.equal(t, base_hf[name]) for name, t in group.gather_hf_state_dict().items())

        # (c) training on a fixed batch lowers the loss and moves only the adapters
        group.save_model_checkpoint(tmp_path / "model", 0)
        set_rollout_log_probs(group, groups)
        losses = [train_on_rollout(group, groups, policy_version=0)["train/pg_loss"] for _ in range(4)]
        assert losses[-1] < losses[0] - 0.05, losses
        group.save_model_checkpoint(tmp_path / "model", 1)
        exported = group.gather_hf_state_dict()
        trained_logits = group.compute_logits(probe)
        root = tmp_path / "ckpt"
        group.save_checkpoint(root, 1)
        uninterrupted = train_on_rollout(group, groups, policy_version=1)

    before = _model_tensors(tmp_path / "model" / "iter_0000000")
    after = _model_tensors(tmp_path / "model" / "iter_0000001")
    assert before.keys() == after.keys()
    for key in before:
        if key.endswith(".lora.b"):
            assert torch.equal(before[key], torch.zeros_like(before[key])) and after[key].abs().max() > 0, key
        elif not key.endswith(".lora.a"):  # A trains too; the base and the scaling must not move
            assert torch.equal(before[key], after[key]), key
    # the engines get W + scaling * B A under the base name: o_proj of layer 1 (one whole tensor in HF)
    proj = "decoder.layers.self_attention.linear_proj."
    w, a, b = after[proj + "weight"][1], after[proj + "lora.a"][1], after[proj + "lora.b"][1]
    assert float(after[proj + "lora.scaling"][1]) == ALPHA / RANK
    merged = w + (ALPHA / RANK) * (b @ a)
    torch.testing.assert_close(exported["model.layers.1.self_attn.o_proj.weight"], merged, rtol=0, atol=1e-6)
    assert not torch.equal(merged, w)
    assert torch.equal(exported["model.embed_tokens.weight"], base_hf["model.embed_tokens.weight"])

    # resume: the adapters and their optimizer state come back (the same next step, bit for bit)
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=2) as group:
        assert initialize_for_training(group, _train(tiny_qwen2, load=root), algo)[0] == 1
        assert all(torch.equal(a, b) for a, b in zip(group.compute_logits(probe), trained_logits))
        resumed = train_on_rollout(group, groups, policy_version=1)
    for name in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert resumed[name] == uninterrupted[name], name


# slow (suite time, issue 24): the default LoRA tests are test_lora_trains_only_the_adapters_and_exports_merged_weights
# and tests/e2e/test_lora_run.py
@pytest.mark.slow
def test_a_lora_checkpoint_needs_lora_to_load(ray_cluster, tiny_qwen2, tmp_path):
    """Loading adapters into a model without them would silently drop the trained update."""
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as group:
        initialize_for_training(group, _train(tiny_qwen2, distributed_optimizer=False), fixed_old_policy())
        group.save_checkpoint(tmp_path / "ckpt", 1)
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as group:
        with pytest.raises(MegatronGroupError, match="holds LoRA adapters"):
            initialize_for_training(group, train_config(tiny_qwen2, load=tmp_path / "ckpt"), fixed_old_policy())


# slow (suite time, issue 24): LoRA at PP=2 (see test_a_lora_checkpoint_needs_lora_to_load)
@pytest.mark.slow
def test_lora_at_pp2_exports_and_converts_to_the_merged_model(ray_cluster, tiny_qwen2, tmp_path):
    """Pipeline stages adapt their own layers; the HF model the converter makes of a LoRA checkpoint is
    the weights sync sent, and a plain (adapter-free) model loaded from it computes the LoRA model."""
    groups = make_groups(seed=5)
    probe = [s.tokens for g in groups for s in g][:3]
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(pipeline_model_parallel_size=2),
                                          world_size=2) as group:
        base_logits = group.compute_logits(probe)
        initialize_for_training(group, _train(tiny_qwen2, distributed_optimizer=False), fixed_old_policy())
        set_rollout_log_probs(group, groups)
        losses = [train_on_rollout(group, groups, policy_version=0)["train/pg_loss"] for _ in range(3)]
        assert losses[-1] < losses[0], losses
        exported = group.gather_hf_state_dict()
        lora_logits = group.compute_logits(probe)
        group.save_checkpoint(tmp_path / "ckpt", 3)
    converted = convert_megatron_to_hf(tmp_path / "ckpt", tmp_path / "hf", hf_config=tiny_qwen2)
    with HFCheckpoint(converted) as checkpoint:
        hf = {name: checkpoint.get(name)[:] for name in checkpoint.names()}
    assert hf.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(hf[name], tensor), name
    with MegatronGroup.from_hf_checkpoint(converted, ParallelConfig(), world_size=1) as plain:
        for ours, theirs, base in zip(plain.compute_logits(probe), lora_logits, base_logits):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)  # float32 rounding of W + s B A
            assert (theirs - base).abs().max() > 1e-2  # while training moved them


# slow (suite time, issue 24): LoRA on MoE layers (see test_a_lora_checkpoint_needs_lora_to_load)
@pytest.mark.slow
def test_moe_layers_adapt_their_attention_only(ray_cluster, tiny_model_factory):
    moe = tiny_model_factory("qwen3_moe")
    with MegatronGroup.from_hf_checkpoint(moe, ParallelConfig(), world_size=1) as group:
        initialize_for_training(group, _train(moe, distributed_optimizer=False), fixed_old_policy())
        trainable = group.trainable_parameters()
        assert {name.split(".")[-3] for name in trainable} == {"linear_qkv", "linear_proj"}, sorted(trainable)
        metrics = train_on_rollout(group, make_groups(seed=6), policy_version=0)
        assert metrics["train/optimizer_steps"] == 1 and metrics["train/grad_norm"] > 0
    with MegatronGroup.from_hf_checkpoint(moe, ParallelConfig(), world_size=1) as group:
        with pytest.raises(MegatronGroupError, match="--lora-target-modules linear_fc1: no such layer"):
            initialize_for_training(group, replace(_train(moe), lora=build(LoraConfig,
                lora_rank=RANK, lora_target_modules=("linear_qkv", "linear_fc1"))), fixed_old_policy())


# slow (suite time): LoRA under TP (see test_a_lora_checkpoint_needs_lora_to_load)
@pytest.mark.slow
def test_lora_at_tp2_trains_as_at_tp1_and_its_checkpoint_loads_at_tp1(ray_cluster, tiny_qwen2, tmp_path):
    """The adapters split as their layers (column-parallel: B's rows; row-parallel: A's columns): the
    same steps give the same losses, gradient norms (the shards counted once, the whole ones once),
    merged weights and logits as at TP = 1, and a TP = 2 checkpoint loads at TP = 1."""
    groups = make_groups(seed=5)
    probe = [s.tokens for g in groups for s in g][:3]
    runs = {}
    for tp in (1, 2):
        with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(tensor_model_parallel_size=tp),
                                              world_size=tp) as group:
            initialize_for_training(group, _train(tiny_qwen2, distributed_optimizer=False), fixed_old_policy())
            set_rollout_log_probs(group, groups)
            metrics = [train_on_rollout(group, groups, policy_version=0) for _ in range(3)]
            runs[tp] = (metrics, group.gather_hf_state_dict(), group.compute_logits(probe))
            if tp == 2:
                group.save_checkpoint(tmp_path / "ckpt", 3)
    (metrics1, hf1, logits1), (metrics2, hf2, logits2) = runs[1], runs[2]
    for one, two in zip(metrics1, metrics2):
        for name in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert two[name] == pytest.approx(one[name], rel=1e-4, abs=1e-6), name
    assert metrics1[-1]["train/pg_loss"] < metrics1[0]["train/pg_loss"]
    assert hf1.keys() == hf2.keys()
    for name in hf1:
        torch.testing.assert_close(hf2[name], hf1[name], rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(logits2, logits1):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as group:
        assert initialize_for_training(group, _train(tiny_qwen2, distributed_optimizer=False,
                                                     load=tmp_path / "ckpt"), fixed_old_policy())[0] == 3
        for ours, theirs in zip(group.compute_logits(probe), logits2):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
