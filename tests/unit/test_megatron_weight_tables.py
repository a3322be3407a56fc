"""HF <-> Megatron weight tables on plain tensors: every family at TP 1 and 2 round-trips bit for
bit, and the fused layouts match hand-written expectations."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.hf_config import SUPPORTED_HF_FAMILIES, arch_from_hf_config
from lean_rl.backends.megatron.hf_weights.families import (
    canonical_megatron_name,
    geometry,
    rule_instances,
    weight_rules,
)
from lean_rl.backends.megatron.hf_weights.layouts import Geometry, Layout, hf_shapes, qkv_blocks, to_hf_tensors, to_megatron_shard


def _parallel(family: str, tp: int) -> ParallelConfig:
    # MoE with TP > 1 needs sequence parallel; experts then use expert-TP = TP
    moe = family in ("qwen3_moe", "mixtral", "glm4_moe", "deepseek_v3")
    return ParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=tp > 1 and moe)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("family", SUPPORTED_HF_FAMILIES)
def test_round_trip_is_bitwise_and_covers_the_checkpoint(family, tp, tiny_model_factory):
    path = tiny_model_factory(family)
    state = load_file(str(path / "model.safetensors"))
    config = MegatronConfig(arch_from_hf_config(path, make_vocab_size_divisible_by=96), _parallel(family, tp))
    geo = geometry(config)
    rules = weight_rules(family, config.arch)
    back = {}
    for rule, index in rule_instances(rules, config.arch):
        names = rule.hf_names(**index)
        shards = [to_megatron_shard(rule.layout, [state[n] for n in names], rank, tp, geo) for rank in range(tp)]
        if rule.layout is not Layout.REPLICATED:
            assert all(s.shape == shards[0].shape for s in shards) and shards[0].shape[0] > 0
        if rule.layout is Layout.VOCAB:
            assert sum(s.shape[0] for s in shards) == config.padded_vocab_size == 576
        for name, tensor in zip(names, to_hf_tensors(rule.layout, shards, geo)):
            if rule.exported:
                back[name] = tensor
    assert sorted(back) == sorted(state)
    assert [n for n in state if not torch.equal(back[n], state[n])] == []


@pytest.mark.parametrize("family", SUPPORTED_HF_FAMILIES)
def test_one_shard_gives_contiguous_views_unless_rows_move(family, tiny_model_factory):
    # At TP 1 the export and the megatron->hf converter copy nothing but QKV's per-group split: the
    # other HF tensors are views of the parameter, contiguous (a broadcast and a file write need that).
    path = tiny_model_factory(family)
    state = load_file(str(path / "model.safetensors"))
    config = MegatronConfig(arch_from_hf_config(path, make_vocab_size_divisible_by=96), _parallel(family, 1))
    geo = geometry(config)
    seen = set()
    for rule, index in rule_instances(weight_rules(family, config.arch), config.arch):
        names = rule.hf_names(**index)
        shard = to_megatron_shard(rule.layout, [state[n] for n in names], 0, 1, geo)
        for name, tensor in zip(names, to_hf_tensors(rule.layout, [shard], geo)):
            assert tensor.is_contiguous() and torch.equal(tensor, state[name]), name
            shares = tensor.untyped_storage().data_ptr() == shard.untyped_storage().data_ptr()
            assert shares == (rule.layout is not Layout.QKV), (name, rule.layout)
            seen.add(rule.layout)
    assert Layout.VOCAB in seen and Layout.ROW in seen and (Layout.GATE_UP in seen or Layout.GATE_UP_FUSED in seen)


def test_qkv_blocks_are_views_whose_concatenation_is_hf_q_k_v(tiny_model_factory):
    # the megatron->hf converter writes the blocks one after another: QKV's rows move with no copy
    path = tiny_model_factory("qwen2")
    state = load_file(str(path / "model.safetensors"))
    config = MegatronConfig(arch_from_hf_config(path, make_vocab_size_divisible_by=96), _parallel("qwen2", 1))
    geo = geometry(config)
    assert geo.num_query_groups > 1  # else one block per tensor, and the test would not see the rows move
    qkv = [(rule, index) for rule, index in rule_instances(weight_rules("qwen2", config.arch), config.arch)
           if rule.layout is Layout.QKV]
    assert {rule.hf_names(**index)[0].rsplit(".", 1)[-1] for rule, index in qkv} == {"weight", "bias"}
    for rule, index in qkv:
        names = rule.hf_names(**index)
        shard = to_megatron_shard(rule.layout, [state[n] for n in names], 0, 1, geo)
        split = qkv_blocks(shard, geo)
        assert len(split) == 3
        for name, blocks, whole in zip(names, split, to_hf_tensors(rule.layout, [shard], geo)):
            assert len(blocks) == geo.num_query_groups
            assert all(b.is_contiguous() and b.untyped_storage().data_ptr() == shard.untyped_storage().data_ptr()
                       for b in blocks), name
            assert torch.equal(torch.cat(blocks), state[name]) and torch.equal(whole, state[name]), name


def test_reading_slices_from_safetensors_gives_the_same_shards(tiny_model_factory):
    path = tiny_model_factory("qwen3_moe")
    state = load_file(str(path / "model.safetensors"))
    config = MegatronConfig(arch_from_hf_config(path, make_vocab_size_divisible_by=96), _parallel("qwen3_moe", 2))
    geo = geometry(config)
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        for rule, index in rule_instances(weight_rules("qwen3_moe", config.arch), config.arch):
            names = rule.hf_names(**index)
            for rank in range(2):
                from_file = to_megatron_shard(rule.layout, [f.get_slice(n) for n in names], rank, 2, geo)
                in_memory = to_megatron_shard(rule.layout, [state[n] for n in names], rank, 2, geo)
                assert torch.equal(from_file, in_memory), (rule.megatron, rank)


def _labelled(prefix: int, rows: int) -> torch.Tensor:
    return torch.arange(rows, dtype=torch.float32) + prefix  # one value per row, e.g. 100, 101, ...


def test_qkv_interleaves_per_query_group_and_splits_groups_over_tp():
    # 4 query groups, 2 q heads per group, head_dim 1: q rows q0..q7, k rows k0..k3, v rows v0..v3
    geo = Geometry(num_query_groups=4, heads_per_group=2, head_dim=1, vocab_size=8, padded_vocab_size=8)
    q, k, v = _labelled(100, 8), _labelled(200, 4), _labelled(300, 4)
    fused = to_megatron_shard(Layout.QKV, [q, k, v], 0, 1, geo)
    expected = [100, 101, 200, 300, 102, 103, 201, 301, 104, 105, 202, 302, 106, 107, 203, 303]
    assert fused.tolist() == expected
    assert to_megatron_shard(Layout.QKV, [q, k, v], 0, 2, geo).tolist() == expected[:8]
    assert to_megatron_shard(Layout.QKV, [q, k, v], 1, 2, geo).tolist() == expected[8:]
    # head_dim > 1 on a weight: rows move as blocks of head_dim
    geo2 = Geometry(num_query_groups=2, heads_per_group=1, head_dim=2, vocab_size=8, padded_vocab_size=8)
    qw, kw, vw = (_labelled(p, 4).unsqueeze(1).expand(4, 3) for p in (100, 200, 300))
    assert to_megatron_shard(Layout.QKV, [qw, kw, vw], 0, 1, geo2)[:, 0].tolist() == [
        100, 101, 200, 201, 300, 301, 102, 103, 202, 203, 302, 303]
    assert [t.tolist() for t in to_hf_tensors(Layout.QKV, [torch.tensor(expected, dtype=torch.float32)], geo)] == [
        q.tolist(), k.tolist(), v.tolist()]


def test_gate_up_is_per_rank_gate_then_up():
    geo = Geometry(num_query_groups=1, heads_per_group=1, head_dim=1, vocab_size=8, padded_vocab_size=8)
    gate, up = _labelled(100, 4), _labelled(200, 4)
    assert to_megatron_shard(Layout.GATE_UP, [gate, up], 0, 1, geo).tolist() == [100, 101, 102, 103, 200, 201, 202, 203]
    # not a contiguous half of the TP 1 tensor: each rank gets its slice of gate, then of up
    assert to_megatron_shard(Layout.GATE_UP, [gate, up], 0, 2, geo).tolist() == [100, 101, 200, 201]
    assert to_megatron_shard(Layout.GATE_UP, [gate, up], 1, 2, geo).tolist() == [102, 103, 202, 203]
    # GLM-4 stores [gate; up] as one tensor: the same shards, and back to the one tensor
    fused = torch.cat([gate, up])
    shards = [to_megatron_shard(Layout.GATE_UP_FUSED, [fused], rank, 2, geo) for rank in (0, 1)]
    assert [t.tolist() for t in shards] == [[100, 101, 200, 201], [102, 103, 202, 203]]
    assert [t.tolist() for t in to_hf_tensors(Layout.GATE_UP_FUSED, shards, geo)] == [fused.tolist()]
    assert hf_shapes(Layout.GATE_UP_FUSED, (8, 3), geo) == [(8, 3)]


def test_vocab_rows_are_padded_with_zeros_and_split_over_tp():
    geo = Geometry(num_query_groups=1, heads_per_group=1, head_dim=1, vocab_size=5, padded_vocab_size=8)
    embedding = _labelled(1, 5).unsqueeze(1).expand(5, 2).contiguous()
    rank0 = to_megatron_shard(Layout.VOCAB, [embedding], 0, 2, geo)
    rank1 = to_megatron_shard(Layout.VOCAB, [embedding], 1, 2, geo)
    assert rank0[:, 0].tolist() == [1, 2, 3, 4] and rank1[:, 0].tolist() == [5, 0, 0, 0]
    assert torch.equal(to_hf_tensors(Layout.VOCAB, [rank0, rank1], geo)[0], embedding)
    with pytest.raises(ValueError, match="--vocab-size 6"):
        to_megatron_shard(Layout.VOCAB, [embedding], 0, 2, Geometry(1, 1, 1, 6, 8))


def test_row_and_column_parallel_split_the_right_dimension():
    geo = Geometry(num_query_groups=1, heads_per_group=1, head_dim=1, vocab_size=8, padded_vocab_size=8)
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert to_megatron_shard(Layout.ROW, [weight], 1, 2, geo).tolist() == [[2, 3], [6, 7], [10, 11]]
    assert to_megatron_shard(Layout.COLUMN, [weight.T.contiguous()], 1, 2, geo).tolist() == [[2, 6, 10], [3, 7, 11]]


def test_table_refuses_an_architecture_it_does_not_map(tiny_model_factory):
    llama = arch_from_hf_config(tiny_model_factory("llama"))
    with pytest.raises(ValueError, match=r"qwen2 weight table cannot map.*add_qkv_bias=False \(needs True\)"):
        weight_rules("qwen2", llama)
    with pytest.raises(ValueError, match="'gpt2' has no weight table; supported: llama, qwen2, qwen3, qwen3_moe"):
        weight_rules("gpt2", llama)


def test_tied_embeddings_load_the_output_layer_from_embed_tokens_and_export_once(tiny_model_factory):
    import dataclasses

    tied = dataclasses.replace(arch_from_hf_config(tiny_model_factory("llama")),
                               untie_embeddings_and_output_weights=False)
    output = [r for r in weight_rules("llama", tied) if r.megatron == "output_layer.weight"]
    assert [(r.hf, r.exported) for r in output] == [(("model.embed_tokens.weight",), False)]


def test_rule_patterns_and_te_names():
    rules = {r.megatron: r for r in weight_rules("qwen3_moe", arch_from_hf_config({
        "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
        "max_position_embeddings": 128, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "norm_topk_prob": True}))}
    fc1 = rules["decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1.weight"]
    match = fc1.pattern.match("decoder.layers.12.mlp.experts.local_experts.3.linear_fc1.weight")
    assert match and match["layer"] == "12" and match["expert"] == "3"
    assert fc1.hf_names(layer=12, expert=7) == ("model.layers.12.mlp.experts.7.gate_proj.weight",
                                                "model.layers.12.mlp.experts.7.up_proj.weight")
    assert canonical_megatron_name("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight") == \
        "decoder.layers.3.input_layernorm.weight"
    assert canonical_megatron_name("decoder.layers.3.mlp.linear_fc1.layer_norm_weight") == \
        "decoder.layers.3.pre_mlp_layernorm.weight"
    assert canonical_megatron_name("decoder.layers.3.mlp.linear_fc1.weight") == "decoder.layers.3.mlp.linear_fc1.weight"
