"""Pure parts of the weight sync: flags, buckets, engine parameter names and checksums, the disk
staging directory."""

from __future__ import annotations

import argparse
import hashlib
import json
import random

import pytest
import torch
from safetensors.torch import save_file

from lean_rl.weight_sync.buckets import Bucket, iter_buckets, standalone
from lean_rl.options import ConfigError, add_options, build, read_options
from lean_rl.weight_sync.config import WeightSyncConfig, probe_statistic, resolve_transport
from lean_rl.weight_sync.disk import INDEX_FILE, DiskStaging
from lean_rl.weight_sync.engine_params import (EngineChecksums, compare_checksums, engine_slot,
                                               tensor_bytes_hash)


# ---------------------------------------------------------------- flags
def parse(*argv: str, colocate: bool = False) -> WeightSyncConfig:
    parser = add_options(argparse.ArgumentParser(), WeightSyncConfig)
    return read_options(WeightSyncConfig, parser.parse_args(list(argv)), colocate=colocate)


def test_auto_transport_follows_slime():
    assert parse().transport == "distributed"
    assert parse(colocate=True).transport == "tensor"
    assert parse("--weight-sync-transport", "disk", colocate=True).transport == "disk"
    assert resolve_transport("tensor", colocate=False) == "tensor"
    assert parse(colocate=True).colocate and build(WeightSyncConfig, colocate=True).transport == "tensor"


def test_flags_reach_the_config():
    cfg = parse("--update-weight-buffer-size", "1024", "--weight-sync-probe-tol", "0.5",
                "--weight-sync-disk-dir", "/x", "--weight-sync-timeout", "9")
    assert (cfg.buffer_size_bytes, cfg.probe_tol, cfg.disk_dir, cfg.timeout_s) == (1024, 0.5, "/x", 9.0)
    assert cfg.probe_tolerance("bfloat16", "float32") == 0.5
    assert parse().probe_tolerance("float32", "float32") == 1e-3
    # either side 16-bit: the 16-bit default, on the mean (probe_statistic)
    assert parse().probe_tolerance("float32", "bfloat16") == parse().probe_tolerance("bfloat16", "float32") == 0.1
    assert probe_statistic("float32", "float32") == "max" and probe_statistic("float32", "bfloat16") == "mean"


@pytest.mark.parametrize("argv, flag", [
    (["--update-weight-buffer-size", "0"], "--update-weight-buffer-size"),
    (["--weight-sync-probe-tol", "-1"], "--weight-sync-probe-tol"),
    (["--weight-sync-timeout", "0"], "--weight-sync-timeout"),
])
def test_bad_flags_name_themselves(argv, flag):
    with pytest.raises(ConfigError, match=flag):
        parse(*argv)


def test_unknown_transport_and_dtype_are_errors():
    with pytest.raises(ConfigError, match="--weight-sync-transport"):
        resolve_transport("carrier-pigeon", colocate=False)
    with pytest.raises(ConfigError, match="--weight-sync-probe-tol"):
        build(WeightSyncConfig, transport="disk").probe_tolerance("float32", "float8_e4m3fn")


# ---------------------------------------------------------------- buckets
def named(sizes, dtype=torch.float32):
    return [(f"t{i}", torch.full((n,), float(i), dtype=dtype)) for i, n in enumerate(sizes)]


def test_buckets_respect_the_size_and_mark_the_last():
    out = list(iter_buckets(named([10, 10, 10, 30, 5]), max_bytes=80))  # float32: 40, 40, 40, 120, 20 bytes
    assert [b.names for b, _ in out] == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]  # t3 alone: larger than a bucket
    assert [last for _, last in out] == [False, False, False, True]
    assert [b.nbytes for b, _ in out] == [80, 40, 120, 20]


def test_a_bucket_holds_one_dtype():
    stream = named([2, 2]) + [("half", torch.ones(2, dtype=torch.bfloat16))] + [("f", torch.ones(2))]
    assert [b.names for b, _ in iter_buckets(stream, max_bytes=10**6)] == [["t0", "t1"], ["half"], ["f"]]
    assert list(iter_buckets([], max_bytes=10)) == []


def test_flatten_is_the_bytes_back_to_back():
    bucket = Bucket()
    a, b = torch.randn(3, 4), torch.randn(5)
    bucket.add("a", a.t())  # non-contiguous input
    bucket.add("b", b)
    flat = bucket.flatten()
    assert flat.dtype == torch.uint8 and flat.numel() == bucket.nbytes == (12 + 5) * 4
    assert torch.equal(flat[:48].view(torch.float32).view(4, 3), a.t())
    assert torch.equal(flat[48:].view(torch.float32), b)
    assert bucket.dtype_names() == ["float32", "float32"] and bucket.shapes() == [[4, 3], [5]]


def test_standalone_drops_the_base_storage():
    base = torch.randn(100)
    view = base[10:20]
    assert standalone(view).untyped_storage().nbytes() == 40
    assert standalone(base) is base


# ---------------------------------------------------------------- engine parameter names and hashes
def test_engine_slots_follow_sglang_fusion():
    k = engine_slot("model.layers.3.self_attn.k_proj.weight", None)
    assert (k.engine_name, k.position, k.num_parts) == ("model.layers.3.self_attn.qkv_proj.weight", 1, 3)
    v_bias = engine_slot("model.layers.0.self_attn.v_proj.bias", None)
    assert v_bias.engine_name == "model.layers.0.self_attn.qkv_proj.bias"
    up = engine_slot("model.layers.0.mlp.up_proj.weight", None)
    assert (up.engine_name, up.position, up.num_parts) == ("model.layers.0.mlp.gate_up_proj.weight", 1, 2)
    w13 = engine_slot("model.layers.1.mlp.experts.2.up_proj.weight", 4)
    assert (w13.engine_name, w13.position, w13.num_parts) == ("model.layers.1.mlp.experts.w13_weight", 5, 8)
    w2 = engine_slot("model.layers.1.mlp.experts.3.down_proj.weight", 4)
    assert (w2.engine_name, w2.position, w2.num_parts) == ("model.layers.1.mlp.experts.w2_weight", 3, 4)
    w3 = engine_slot("model.layers.1.block_sparse_moe.experts.2.w3.weight", 4)  # mixtral: w1 gate, w3 up
    assert (w3.engine_name, w3.position, w3.num_parts) == ("model.layers.1.block_sparse_moe.experts.w13_weight", 5, 8)
    w2 = engine_slot("model.layers.1.block_sparse_moe.experts.3.w2.weight", 4)
    assert (w2.engine_name, w2.position, w2.num_parts) == ("model.layers.1.block_sparse_moe.experts.w2_weight", 3, 4)
    for same in ("model.layers.0.mlp.gate.weight", "model.layers.0.block_sparse_moe.gate.weight", "model.norm.weight",
                 "model.layers.0.mlp.down_proj.weight"):
        assert engine_slot(same, 4).engine_name == same
    with pytest.raises(ValueError, match="num-experts"):
        engine_slot("model.layers.1.mlp.experts.3.down_proj.weight", None)


def sglang_cpu_hash(tensor: torch.Tensor) -> str:
    # what sglang/srt/managers/mm_utils.py:tensor_hash does for one CPU tensor
    digest = hashlib.sha256(memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())).digest()
    return f"{int.from_bytes(digest[:8], 'big', signed=False):016x}"


def test_checksums_match_the_fused_parameter_in_any_feed_order():
    rng = torch.Generator().manual_seed(0)
    hf = {f"model.layers.0.self_attn.{p}_proj.weight": torch.randn(r, 8, generator=rng)
          for p, r in (("q", 8), ("k", 4), ("v", 4))}
    hf.update({f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": torch.randn(6, 8, generator=rng)
               for e in range(3) for p in ("gate", "up")})
    hf["model.embed_tokens.weight"] = torch.randn(100, 8, generator=rng)  # padded to 128 rows by the engine
    items = list(hf.items())
    random.Random(1).shuffle(items)
    checksums = EngineChecksums(num_experts=3)
    for name, tensor in items:
        checksums.add(name, tensor)
    assert checksums.incomplete() == []
    qkv = torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    w13 = torch.stack([torch.cat([hf[f"model.layers.0.mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up")])
                       for e in range(3)])
    embed = torch.cat([hf["model.embed_tokens.weight"], torch.zeros(28, 8)])
    assert checksums.checksums == {
        "model.layers.0.self_attn.qkv_proj.weight": sglang_cpu_hash(qkv),
        "model.layers.0.mlp.experts.w13_weight": sglang_cpu_hash(w13),
        "model.embed_tokens.weight": sglang_cpu_hash(embed),
    }
    assert sorted(checksums.sources["model.layers.0.self_attn.qkv_proj.weight"]) == sorted(
        f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert tensor_bytes_hash([qkv[:4], qkv[4:]]) == sglang_cpu_hash(qkv)


def test_incomplete_and_duplicate_parts_are_reported():
    checksums = EngineChecksums(num_experts=None)
    checksums.add("model.layers.0.mlp.gate_proj.weight", torch.ones(2, 2))
    assert checksums.incomplete() == ["model.layers.0.mlp.gate_up_proj.weight"]
    with pytest.raises(ValueError, match="already filled"):
        checksums.add("model.layers.0.mlp.gate_proj.weight", torch.ones(2, 2))


def test_compare_checksums_lists_differences_in_engine_order():
    trainer = {"a": "1", "b": "2", "c": "3", "only_trainer": "9"}
    engine = {"c": "3", "b": "X", "a": "Y", "lm_head.weight": "tied"}
    diff = compare_checksums(trainer, engine)
    assert diff.differing == ["b", "a"] and diff.missing_on_engine == ["only_trainer"] and diff.compared == 3


# ---------------------------------------------------------------- disk staging
def test_disk_staging_publishes_complete_directories_only(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "config.json").write_text("{}")
    (served / "tokenizer.json").write_text("{}")
    save_file({"x": torch.ones(1)}, str(served / "model.safetensors"))
    staging = DiskStaging(tmp_path / "sync", served)
    first = staging.start("1")
    assert first.name.startswith(".") and not (tmp_path / "sync" / "step_1").exists()
    save_file({"w": torch.ones(2)}, str(first / "model-pp000-00001.safetensors"))
    published = staging.publish(first, "1", {"w": "model-pp000-00001.safetensors"}, 8)
    assert published == tmp_path / "sync" / "step_1" and not first.exists()
    assert sorted(p.name for p in published.iterdir()) == sorted(
        ["config.json", "tokenizer.json", INDEX_FILE, "model-pp000-00001.safetensors"])
    assert json.loads((published / INDEX_FILE).read_text())["weight_map"] == {"w": "model-pp000-00001.safetensors"}
    staging.loaded(published)
    second = staging.publish(staging.start("2"), "2", {}, 0)
    staging.loaded(second)
    assert not published.exists() and second.exists()  # the previous step goes once the new one is loaded
    staging.close()
    assert second.exists()  # a user-given directory keeps the last checkpoint


def test_disk_staging_needs_the_served_checkpoint(tmp_path):
    from lean_rl.weight_sync.errors import WeightSyncError

    with pytest.raises(WeightSyncError, match="served checkpoint"):
        DiskStaging(tmp_path, tmp_path / "missing")
