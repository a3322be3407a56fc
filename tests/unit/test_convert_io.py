"""The converters' streaming I/O on plain tensors: the safetensors writer produces files the
safetensors library reads back exactly; the reader matches safe_open and checks headers against file
sizes; the dist-checkpoint writer produces each chunk lazily, cuts files at its byte budget, and the
reader reassembles any region from the stored chunks; dist keys follow Megatron's naming."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.hf_config import arch_from_hf_config
from lean_rl.backends.megatron.hf_weights.dist_keys import dist_entries, extra_state_keys
from lean_rl.backends.megatron.hf_weights.families import geometry, weight_rules
from lean_rl.backends.megatron.hf_weights.layouts import hf_shapes, to_hf_tensors
from lean_rl.convert.dcp_io import ChunkSpec, DistCheckpointReader, save_dist_checkpoint
from lean_rl.convert.safetensors_io import (
    CheckpointError,
    PlannedTensor,
    SafetensorsFile,
    StreamingSafetensorsWriter,
    parse_size,
    plan_shards,
)


def test_streaming_writer_round_trips_through_the_safetensors_library(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).bfloat16(), "c": torch.arange(6, dtype=torch.int64),
               "empty": torch.zeros(0, 4)}
    writer = StreamingSafetensorsWriter(tmp_path / "x.safetensors",
                                        [PlannedTensor(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()])
    for name, tensor in tensors.items():
        writer.write(name, tensor)
    writer.close()
    back = load_file(str(tmp_path / "x.safetensors"))
    assert sorted(back) == sorted(tensors)
    assert all(torch.equal(back[n], t) and back[n].dtype == t.dtype for n, t in tensors.items())
    ours = SafetensorsFile(tmp_path / "x.safetensors")
    assert all(torch.equal(ours.read(n), t) for n, t in tensors.items())


def test_streaming_writer_refuses_what_was_not_planned(tmp_path):
    writer = StreamingSafetensorsWriter(tmp_path / "x.safetensors", [PlannedTensor("a", torch.float32, (2,))])
    with pytest.raises(RuntimeError, match="wrote b, expected a"):
        writer.write("b", torch.zeros(2))
    with pytest.raises(RuntimeError, match=r"a is torch.float16 \[2\], planned torch.float32 \[2\]"):
        writer.write("a", torch.zeros(2, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="1 planned tensors were not written"):
        writer.close()


def test_streaming_writer_takes_a_tensor_as_its_row_blocks(tmp_path):
    whole = torch.randn(6, 4)
    fused = torch.cat([whole[:2], torch.zeros(1, 4), whole[2:4], torch.zeros(1, 4), whole[4:]])  # rows apart
    blocks = [fused[0:2], fused[3:5], fused[6:8]]  # views, each contiguous, not adjacent in memory
    writer = StreamingSafetensorsWriter(tmp_path / "x.safetensors", [PlannedTensor("w", torch.float32, (6, 4)),
                                                                       PlannedTensor("b", torch.float32, (3,))])
    with pytest.raises(RuntimeError, match=r"w given as blocks torch.float32 \[2, 4\].*planned torch.float32 \[6, 4\]"):
        writer.write_blocks("w", blocks[:2])
    with pytest.raises(RuntimeError, match="w given as blocks"):
        writer.write_blocks("w", [b.double() for b in blocks])
    with pytest.raises(RuntimeError, match="wrote b, expected w"):
        writer.write_blocks("b", [torch.zeros(3)])
    writer.write_blocks("w", blocks)
    writer.write_blocks("b", [torch.tensor([1.0]), torch.tensor([2.0, 3.0])])
    writer.close()
    back = load_file(str(tmp_path / "x.safetensors"))
    assert torch.equal(back["w"], whole) and torch.equal(back["b"], torch.tensor([1.0, 2.0, 3.0]))


def test_reader_checks_headers_against_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.randn(100, 10)}, str(path))
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match=r"truncated: tensor w ends at byte \d+, the file has \d+ bytes"):
        SafetensorsFile(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        SafetensorsFile(path)
    path.write_bytes(b"\x00\x01")
    with pytest.raises(CheckpointError, match="no header"):
        SafetensorsFile(path)


def test_plan_shards_keeps_groups_whole_and_in_order():
    assert plan_shards([40, 40, 40, 100, 10], 100) == [[0, 1], [2], [3], [4]]
    assert plan_shards([5, 5], 1000) == [[0, 1]]
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("1000") == 1000
    with pytest.raises(ValueError, match="expected a positive number"):
        parse_size("lots")


def test_dist_writer_is_lazy_budgeted_and_reader_reassembles_regions(tmp_path):
    full = torch.arange(4 * 6 * 3, dtype=torch.float32).reshape(4, 6, 3)
    chunks = [ChunkSpec("w", (4, 6, 3), (layer, 0, 0), (1, 6, 3), torch.float32) for layer in range(4)]
    chunks.append(ChunkSpec("v", (5,), (0,), (5,), torch.bfloat16))
    produced = []

    def produce(spec: ChunkSpec) -> torch.Tensor:
        produced.append(spec.key)
        if spec.key == "v":
            return torch.ones(5, dtype=torch.bfloat16)
        return full[spec.offsets[0]:spec.offsets[0] + 1].clone()

    (tmp_path / "ck").mkdir()
    save_dist_checkpoint(tmp_path / "ck", chunks, produce, {"obj/shard_0_1": [None]}, max_file_bytes=2 * 6 * 3 * 4)
    assert produced == ["w", "w", "w", "w", "v"]  # each chunk built once, when written
    assert len(list((tmp_path / "ck").glob("*.distcp"))) == 3  # 2 layers per file, then the rest
    assert json.loads((tmp_path / "ck" / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    reader = DistCheckpointReader(tmp_path / "ck")
    assert torch.equal(reader.read("w", (1, 2, 0), (2, 3, 3)), full[1:3, 2:5])  # spans two stored chunks
    assert torch.equal(reader.read("w", (0, 0, 0), (4, 6, 3)), full)
    assert reader.read("v", (0,), (5,)).dtype == torch.bfloat16 and reader.objects() == ["obj/shard_0_1"]


def test_dist_keys_follow_megatron_naming(tiny_model_factory):
    arch = arch_from_hf_config(tiny_model_factory("qwen3_moe"))
    rules = weight_rules("qwen3_moe", arch)
    by_key = {key: entry for entry in dist_entries(rules, arch, 512) for key in entry.keys}
    assert by_key["decoder.layers.self_attention.linear_qkv.layer_norm_weight"].global_shape(arch) == (2, 64)
    assert by_key["decoder.layers.mlp.experts.experts.linear_fc1.weight"].global_shape(arch) == (2, 4, 256, 64)
    assert by_key["decoder.layers.mlp.experts.experts.linear_fc1.weight"].chunk_offsets({"layer": 1, "expert": 3}) \
        == (1, 3, 0, 0)
    # the MoE pre-MLP norm under both specs' names, one entry
    assert by_key["decoder.layers.pre_mlp_layernorm.weight"] is by_key["decoder.layers.mlp.linear_fc1.layer_norm_weight"]
    objects = extra_state_keys(rules, arch)
    assert len(objects) == 2 * (2 + 4 * 2)  # per layer: qkv, proj, and fc1 / fc2 of 4 experts
    assert "decoder.layers.mlp.experts.experts.linear_fc2._extra_state/shard_1.3_2.4" in objects
    assert "decoder.layers.self_attention.linear_qkv._extra_state/shard_0_2" in objects


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3", "qwen3_moe"])
def test_hf_shapes_are_the_shapes_to_hf_tensors_makes(family, tiny_model_factory):
    arch = arch_from_hf_config(tiny_model_factory(family), make_vocab_size_divisible_by=96)
    config = MegatronConfig(arch, ParallelConfig())
    geo = geometry(config)
    for entry in dist_entries(weight_rules(family, arch), arch, config.padded_vocab_size):
        made = to_hf_tensors(entry.rule.layout, [torch.zeros(entry.param_shape)], geo)
        assert hf_shapes(entry.rule.layout, entry.param_shape, geo) == [tuple(t.shape) for t in made], entry.keys


def test_dist_reader_reads_whole_pieces_straight_into_place_and_strided_ones_through_dcp(tmp_path):
    import os

    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    from lean_rl.convert.dcp_direct import _read_direct

    full = torch.randn(2, 4, 6).to(torch.bfloat16)
    strided = torch.randn(6, 4).t()  # saved as a transposed view: not contiguous on disk
    (tmp_path / "ck").mkdir()
    save_dist_checkpoint(tmp_path / "ck", [ChunkSpec("w", (2, 4, 6), (i, 0, 0), (1, 4, 6), torch.bfloat16) for i in (0, 1)]
                         + [ChunkSpec("s", (4, 6), (0, 0), (4, 6), torch.float32)],
                         lambda spec: full[spec.offsets[0]:spec.offsets[0] + 1].clone() if spec.key == "w" else strided,
                         {}, max_file_bytes=10**6)
    reader = DistCheckpointReader(tmp_path / "ck")
    stored = reader.metadata.state_dict_metadata["w"]
    (item,) = create_read_items_for_chunk_list("w", stored, [ChunkStorageMetadata(torch.Size((1, 1, 0)),
                                                                                  torch.Size((1, 2, 6)))])
    info = reader.metadata.storage_data[item.storage_index]
    dest = torch.empty(1, 2, 6, dtype=torch.bfloat16)
    fd = os.open(tmp_path / "ck" / info.relative_path, os.O_RDONLY)
    try:
        assert _read_direct(fd, tmp_path, info.offset, info.length, item, dest)  # the direct path, bit for bit
    finally:
        os.close(fd)
    assert torch.equal(dest.view(torch.int16), full[1:2, 1:3].view(torch.int16))
    assert torch.equal(reader.read("w", (0, 1, 2), (2, 3, 3)).view(torch.int16), full[:, 1:4, 2:5].view(torch.int16))
    assert torch.equal(reader.read("s", (1, 0), (2, 6)), strided[1:3])  # a strided piece: DCP's read, same values


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_fused_reads_are_to_megatron_shard_bit_for_bit(family, tiny_model_factory, tmp_path):
    from lean_rl.backends.megatron.hf_weights.layouts import to_megatron_shard
    from lean_rl.convert.fused_read import read_tp1
    from lean_rl.convert.hf_to_megatron import ordered_instances
    from lean_rl.convert.safetensors_io import HFSafetensors

    arch = arch_from_hf_config(tiny_model_factory(family), make_vocab_size_divisible_by=96)
    config = MegatronConfig(arch, ParallelConfig())
    geo = geometry(config)
    instances = ordered_instances(dist_entries(weight_rules(family, arch), arch, config.padded_vocab_size), arch)
    tensors = {}
    for inst in instances:
        for name, shape in zip(inst.hf_names, hf_shapes(inst.entry.rule.layout, inst.entry.param_shape, geo)):
            tensors[name] = torch.randn(shape).to(torch.bfloat16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    source = HFSafetensors(tmp_path)
    fused = set()
    for inst in instances:
        layout = inst.entry.rule.layout
        ours = read_tp1(layout, [source.tensors[n] for n in inst.hf_names], geo, torch.bfloat16)
        if ours is None:
            continue
        fused.add(layout.name)
        made = to_megatron_shard(layout, [tensors[n] for n in inst.hf_names], 0, 1, geo)
        assert torch.equal(ours.view(torch.int16), made.view(torch.int16)), inst.hf_names
        assert read_tp1(layout, [source.tensors[n] for n in inst.hf_names], geo, torch.float32) is None  # a cast
    assert {"QKV", "GATE_UP", "VOCAB", "REPLICATED", "ROW"} <= fused


def test_reused_buffer_hands_out_tensors_whose_storage_is_exactly_their_bytes():
    from lean_rl.convert.reused_buffer import ReusedBuffer

    buffer = ReusedBuffer(64)
    first = buffer.tensor((2, 4), torch.float32)
    first.copy_(torch.arange(8.0).view(2, 4))
    # DCP's writer clones a tensor whose storage is larger than it (filesystem.py _SerialCpuLoader.values)
    assert first.untyped_storage().size() == first.nbytes == 32
    second = buffer.tensor((3,), torch.int16)  # the same bytes: the next tensor overwrites the last
    second.fill_(-1)
    assert first.view(-1)[0].view(torch.int32) == -1 and first.view(-1)[2] == 2.0
    assert buffer.tensor((0, 5), torch.bfloat16).shape == (0, 5)
    with pytest.raises(ValueError, match="needs 68 bytes; the buffer has 64"):
        buffer.tensor((17,), torch.float32)


def test_converting_through_the_reused_buffer_writes_what_fresh_tensors_would(tiny_model_factory, tmp_path):
    """Both directions through the one buffer: every HF tensor back bit for bit (a chunk overwritten before
    it was written out would show as another chunk's bytes)."""
    from safetensors.torch import load_file

    from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron
    from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf

    hf = tiny_model_factory("qwen2")
    convert_hf_to_megatron(hf, tmp_path / "dist", max_file_bytes=20_000)  # many files: the budget cut included
    convert_megatron_to_hf(tmp_path / "dist", tmp_path / "back", max_shard_bytes=20_000)
    original = {}
    for path in sorted(hf.glob("*.safetensors")):
        original.update(load_file(path))
    back = {}
    for path in sorted((tmp_path / "back").glob("*.safetensors")):
        back.update(load_file(path))
    assert sorted(back) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(back[name].view(torch.uint8), tensor.view(torch.uint8)), name
