"""The GPU paths' decisions, checked without a GPU (review ../shared/reviews/gpu-static-2026-12-02.md):
the trainer's dtype (--bf16 / --fp16 / the checkpoint's), the engines' dtype, the flags and environment
of a colocated GPU server (M1-M3, M6), which engines CUDA IPC can serve (C1) and what the transport
resolver picks or refuses (C1, C5)."""

from __future__ import annotations

import argparse

import pytest

from lean_rl.backends.megatron.config import PrecisionFlags
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.command_line import (COLOCATED_GPU_ENV, COLOCATED_GPU_FLAGS, engines_dtype, flags_to_dict,
                                                  serving_dtype, split_passthrough)
from lean_rl.backends.sglang.server_command import server_flags
from lean_rl.options import ConfigError, add_options, build, read_options
from lean_rl.weight_sync.config import WeightSyncConfig, resolve_transport
from lean_rl.weight_sync.ipc_map import IpcLayout, engine_ranks, stage_lead_ranks, unserved_by_ipc


# ---------------------------------------------------------------- dtypes
@pytest.mark.parametrize("flags, device, checkpoint, expected", [
    ({}, "cpu", "bfloat16", "float32"),  # CPU: float32 unless asked
    ({}, "cuda", "bfloat16", "bfloat16"),  # GPU: 16-bit whatever the checkpoint's dtype (N1)
    ({}, "cuda", "float16", "float16"),
    ({}, "cuda", "float32", "bfloat16"),  # FA3 has no float32 kernels; TE's float32 is TF32 anyway
    ({}, "cuda", None, "bfloat16"),
    ({"bf16": True}, "cpu", "float32", "bfloat16"),
    ({"fp16": True}, "cuda", "bfloat16", "float16"),
])
def test_trainer_dtype(flags, device, checkpoint, expected):
    assert PrecisionFlags(**flags).params_dtype(device, checkpoint) == expected


def test_bf16_and_fp16_exclude_each_other():
    with pytest.raises(ConfigError, match="--bf16 and --fp16"):
        PrecisionFlags(bf16=True, fp16=True).params_dtype("cuda", None)


@pytest.mark.parametrize("requested, checkpoint, expected", [
    ("auto", "bfloat16", "bfloat16"), ("auto", "float32", "float16"), ("auto", None, "float16"),
    ("half", "bfloat16", "float16"), ("float", "bfloat16", "float32"), ("BFloat16", None, "bfloat16"),
])
def test_serving_dtype_resolves_as_sglang(requested, checkpoint, expected):
    assert serving_dtype(requested, checkpoint) == expected


def test_engines_serve_the_trainers_dtype_unless_told():
    assert engines_dtype((), "bfloat16", "float32") == "bfloat16"
    assert engines_dtype(("--dtype", "auto"), "float32", "float32") == "float16"
    assert engines_dtype(("--mem-fraction-static", "0.5", "--dtype", "float32"), "bfloat16", None) == "float32"
    with pytest.raises(ConfigError, match="--sglang-dtype"):
        engines_dtype(("--dtype", "float8"), "float32", None)


# ---------------------------------------------------------------- colocated GPU servers (M1-M3, M6)
def engine_config(device: str, colocated: bool, *argv: str) -> EngineConfig:
    parser = add_options(argparse.ArgumentParser(allow_abbrev=False), EngineConfig)
    args, unknown = parser.parse_known_args(["--hf-checkpoint", "/m", "--sglang-api-key", "k", *argv])
    return read_options(EngineConfig, args, device=device, server_passthrough=split_passthrough(unknown).server,
                        colocated=colocated, dtype="bfloat16")


def test_a_colocated_gpu_server_can_release_its_memory():
    config = engine_config("cuda", True, "--rollout-num-gpus-per-engine", "2")
    flags = flags_to_dict(server_flags(config, 0, 30000))
    assert flags["--enable-memory-saver"] == []  # M1: else release is SGLang's no-op adapter
    assert flags["--cuda-graph-backend-prefill"] == ["disabled"]  # M2: the breakable backend raises
    assert flags["--dtype"] == ["bfloat16"] and flags["--tp-size"] == ["2"]
    env = config.server_env()
    assert env["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] == "true"  # M2: graphs are released too
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"  # M3: /health never generates
    assert env["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] == "false"  # M6
    assert env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "false"


@pytest.mark.parametrize("device, colocated", [("cuda", False), ("cpu", True), ("cpu", False)])
def test_other_servers_keep_sglangs_defaults(device, colocated):
    config = engine_config(device, colocated)
    flags = flags_to_dict(server_flags(config, 0, 30000))
    assert not set(COLOCATED_GPU_FLAGS) & set(flags)
    assert not set(COLOCATED_GPU_ENV) & set(config.server_env())
    assert flags["--dtype"] == ["bfloat16"]  # explicit on every device: never SGLang's `auto`


# ---------------------------------------------------------------- which engines CUDA IPC serves (C1)
def layout(tp=1, dp=1, pp=1, per_node=None, engines=1, gpe=1, nodes=None):
    per_node = per_node or tp * dp * pp
    return IpcLayout(tp, dp, pp, per_node, engines, gpe, tuple(nodes or [0] * engines))


def test_stage_leads_follow_megatrons_rank_order():
    assert stage_lead_ranks(2, 2, 2) == [0, 4]  # tp fastest, then dp, then pp
    assert stage_lead_ranks(1, 4, 1) == [0]
    assert stage_lead_ranks(2, 1, 4) == [0, 2, 4, 6]


def test_engines_see_the_gpus_of_the_ranks_they_share():
    assert engine_ranks(layout(dp=8, engines=2, gpe=4)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert engine_ranks(layout(dp=4, per_node=2, engines=2, gpe=2, nodes=[0, 1])) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("case, expected", [
    (layout(dp=8, engines=1, gpe=8), []),  # one engine over every GPU: served
    (layout(tp=4, dp=2, engines=1, gpe=4), []),  # one stage, its lead (rank 0) inside the engine
    (layout(dp=8, engines=2, gpe=4), [(1, 0)]),  # engine 1 cannot open rank 0's memory
    (layout(dp=8, engines=8, gpe=1), [(e, 0) for e in range(1, 8)]),
    (layout(tp=2, dp=1, pp=2, engines=1, gpe=2), [(0, 1)]),  # stage 1's lead is rank 2, outside GPUs 0-1
    (layout(tp=2, dp=1, pp=2, engines=1, gpe=4), []),  # the engine covers both leads
    (layout(dp=4, per_node=2, engines=2, gpe=2, nodes=[0, 1]), [(1, 0)]),  # another node: never
])
def test_unserved_engine_stage_pairs(case, expected):
    assert unserved_by_ipc(case) == expected


# ---------------------------------------------------------------- the transport resolver (C1, C5)
def test_cpu_keeps_slimes_choice():
    assert resolve_transport("auto", colocate=True) == "tensor"
    assert resolve_transport("auto", colocate=False) == "distributed"
    assert resolve_transport("distributed", colocate=True) == "distributed"  # gloo: no device to share


def test_gpu_colocated_uses_ipc_only_where_it_serves_every_engine_else_disk():
    assert resolve_transport("auto", True, "cuda", None) == "tensor"
    assert resolve_transport("auto", True, "cuda", "engine 1 sees ...") == "disk"  # never NCCL (C5)
    assert resolve_transport("auto", False, "cuda", None) == "distributed"
    with pytest.raises(ConfigError, match="cannot reach every engine: engine 1 sees"):
        resolve_transport("tensor", True, "cuda", "engine 1 sees ...")
    with pytest.raises(ConfigError, match="needs --colocate"):
        resolve_transport("tensor", False, "cuda", None)
    with pytest.raises(ConfigError, match="same GPU into one NCCL group"):
        resolve_transport("distributed", True, "cuda", None)
    assert build(WeightSyncConfig, colocate=True, device="cuda", ipc_unserved="x").transport == "disk"


def test_run_config_derives_the_ipc_verdict(tiny_qwen2, tmp_path, monkeypatch):
    """parse_config, as on a machine with a GPU: 8 ranks, 2 colocated engines of 4 -> disk."""
    import lean_rl.config as config_module

    monkeypatch.setattr(config_module, "detect_device", lambda: "cuda")
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1 + 1 =", "label": "2"}\n')
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--colocate"]
    cfg = config_module.parse_config([*base, "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "8"])
    assert cfg.weight_sync.transport == "disk" and "engine 1" in cfg.weight_sync.ipc_unserved
    assert cfg.engines.releases_memory and cfg.megatron.params_dtype == cfg.engines.dtype == "bfloat16"  # N1
    one = config_module.parse_config([*base, "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1"])
    assert one.weight_sync.transport == "tensor" and one.weight_sync.ipc_unserved is None
    # P3: an engine of TP > 1 would open the lead's one bucket from every TP rank: disk instead
    tp = config_module.parse_config([*base, "--actor-num-gpus-per-node", "8", "--rollout-num-gpus-per-engine", "8",
                                     "--rollout-num-gpus", "8"])
    assert tp.weight_sync.transport == "disk" and "engines of TP 8" in tp.weight_sync.ipc_unserved
    assert tp.engines.start_timeout_s == 900  # N7: a cold first start on GPU compiles kernels


# ---------------------------------------------------------------- the layer spec switch (C3)
def test_te_spec_only_when_asked_for_and_on_a_gpu():
    import torch

    from lean_rl.backends.megatron.compat import uses_te_layer_spec

    assert not uses_te_layer_spec(torch.device("cpu"), "transformer_engine")  # no TE without CUDA
    assert not uses_te_layer_spec(torch.device("cuda"), "local")  # the switch wins over TE


def test_lora_on_a_gpu_with_te_asks_for_the_local_spec(monkeypatch):
    import importlib.util

    from lean_rl.backends.megatron.lora_config import LoraConfig

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "transformer_engine" else real_find_spec(name, *a))
    lora = build(LoraConfig, lora_rank=8)
    with pytest.raises(ConfigError, match="--transformer-impl local"):
        lora.check_layer_spec("transformer_engine", "cuda")
    lora.check_layer_spec("local", "cuda")
    lora.check_layer_spec("transformer_engine", "cpu")
    build(LoraConfig).check_layer_spec("transformer_engine", "cuda")  # no LoRA, no constraint


# ---------------------------------------------------------------- trainer ranks' environment (C6)
def test_gpu_ranks_match_sglangs_nccl_switches():
    from lean_rl.backends.megatron.rank_placement import rank_env

    gpu = rank_env("cuda", 1, "/p")
    assert gpu["NCCL_CUMEM_ENABLE"] == "0" and gpu["NCCL_NVLS_ENABLE"] == "0" and gpu["PYTHONPATH"] == "/p"
    assert rank_env("cpu", 2, None) == {"OMP_NUM_THREADS": "2"}


# ---------------------------------------------------------------- RNG state across device kinds (W3)
def test_rng_state_is_restored_only_on_the_device_kind_that_saved_it():
    from lean_rl.backends.megatron.checkpoint import rng_state_fits

    layout = [2, 1, 2, 1]
    assert rng_state_fits({"layout": layout, "device": "cuda"}, layout, "cuda")
    assert not rng_state_fits({"layout": layout, "device": "cpu"}, layout, "cuda")
    assert rng_state_fits({"layout": layout}, layout, "cpu")  # older checkpoints: all from CPU runs
    assert not rng_state_fits({"layout": layout}, layout, "cuda")
    assert not rng_state_fits({"layout": [2, 2, 1, 1], "device": "cpu"}, layout, "cpu")


# ---------------------------------------------------------------- the probe's verdict with two dtypes (C2, W2)
class _ChecksumEngine:
    base_url = "http://e0"

    def __init__(self, checksums):
        self.checksums = checksums

    def submit(self, fn, *args, **kwargs):
        from concurrent.futures import Future

        assert fn.__name__ == "weight_checksums"
        future = Future()
        future.set_result([self.checksums])  # per TP rank
        return future


def _result(max_diff, mean_diff, statistic, tolerance):
    from lean_rl.weight_sync.probe import EngineProbe, ProbeResult

    return ProbeResult(version="3", tolerance=tolerance, num_tokens=55, statistic=statistic,
                       engines=(EngineProbe("http://e0", max_diff, mean_diff, "3"),))


def test_a_16_bit_probe_judges_the_mean_and_a_dtype_gap_is_named_as_such():
    from lean_rl.weight_sync.errors import WeightSyncProbeError
    from lean_rl.weight_sync.probe import raise_on_failure

    same = {"model.layers.0.mlp.down_proj.weight": "ab12", "model.embed_tokens.weight": "cd34"}
    trainer = lambda: (same, {name: [name] for name in same})  # noqa: E731
    # 16-bit rounding: a large max, a small mean -> passes
    raise_on_failure(_result(0.7, 0.05, "mean", 0.1), [_ChecksumEngine(same)], [1], trainer, 5, ("float32", "bfloat16"))
    # a real gap with every byte in place and different dtypes: "dtype differs", no tensor blamed
    with pytest.raises(WeightSyncProbeError, match="dtype differs: the trainer computes in float32") as err:
        raise_on_failure(_result(3.0, 0.3, "mean", 0.1), [_ChecksumEngine(same)], [1], trainer, 5,
                         ("float32", "bfloat16"))
    assert err.value.tensors == [] and "mean |Δ log p| 0.3 > tolerance 0.1" in str(err.value)
    # bytes that differ are still named, whatever the dtypes
    other = {**same, "model.layers.0.mlp.down_proj.weight": "ffff"}
    with pytest.raises(WeightSyncProbeError, match="bytes differ") as err:
        raise_on_failure(_result(3.0, 0.3, "mean", 0.1), [_ChecksumEngine(other)], [1], trainer, 5,
                         ("float32", "bfloat16"))
    assert err.value.tensors == ["model.layers.0.mlp.down_proj.weight"]


# ---------------------------------------------------------------- review 2026-12-06 (N1, N4, N7, P3)
def test_a_float32_engine_on_gpu_gets_an_attention_backend_with_float32_kernels():
    from lean_rl.backends.sglang.server_command import gpu_fp32_note
    from lean_rl.options import rebuild

    fp32 = rebuild(engine_config("cuda", True), dtype="float32")
    assert flags_to_dict(server_flags(fp32, 0, 30000))["--attention-backend"] == ["triton"]  # FA3 has none (N1)
    assert "attention backend triton" in gpu_fp32_note(fp32)
    chosen = rebuild(engine_config("cuda", False, "--sglang-attention-backend", "torch_native"), dtype="float32")
    assert flags_to_dict(server_flags(chosen, 0, 30000))["--attention-backend"] == ["torch_native"]  # the user's
    assert "attention backend torch_native" in gpu_fp32_note(chosen)
    bf16 = engine_config("cuda", True)
    assert "--attention-backend" not in flags_to_dict(server_flags(bf16, 0, 30000)) and gpu_fp32_note(bf16) is None
    cpu = rebuild(engine_config("cpu", False), dtype="float32")
    assert flags_to_dict(server_flags(cpu, 0, 30000))["--attention-backend"] == ["torch_native"]
    assert gpu_fp32_note(cpu) is None


def test_engine_start_timeout_defaults_by_device_and_the_flag_wins():
    assert engine_config("cpu", False).start_timeout_s == 300
    assert engine_config("cuda", False).start_timeout_s == 900  # N7: cold FlashInfer JIT + CUDA graphs
    assert engine_config("cuda", False, "--engine-start-timeout", "120").start_timeout_s == 120
    with pytest.raises(ConfigError, match="--engine-start-timeout"):
        engine_config("cuda", False, "--engine-start-timeout", "0")


def test_float32_on_gpu_is_judged_as_tf32():
    from lean_rl.weight_sync.config import probe_statistic

    gpu, cpu = build(WeightSyncConfig, device="cuda", colocate=True), build(WeightSyncConfig)
    assert probe_statistic("float32", "float32", "cpu") == "max" and cpu.probe_tolerance("float32", "float32") == 1e-3
    # TF32 GEMMs round like float16: the mean, with float16's bound (N1)
    assert probe_statistic("float32", "float32", "cuda") == "mean"
    assert gpu.probe_tolerance("float32", "float32") == 0.05
    assert gpu.probe_tolerance("float32", "bfloat16") == gpu.probe_tolerance("bfloat16", "bfloat16") == 0.1
    assert build(WeightSyncConfig, device="cuda", probe_tol=0.3).probe_tolerance("float32", "float32") == 0.3


def test_engines_of_tp_above_one_are_not_served_by_ipc():
    from lean_rl.weight_sync.ipc_map import ipc_refusal

    assert ipc_refusal(layout()) is None
    assert "engines of TP 2" in ipc_refusal(layout(tp=2, gpe=2))  # P3: every TP rank opens the lead's GPU
    assert "engine 1 sees" in ipc_refusal(layout(dp=2, engines=2))


def test_a_failed_probe_with_an_offloaded_trainer_says_so_and_hashes_nothing():
    """N4: colocated on GPU the probe runs after the trainer offloaded; naming the tensor would export
    offloaded weights. The error says why no tensor is named; the trainer's checksums are never asked."""
    from lean_rl.weight_sync.errors import WeightSyncProbeError
    from lean_rl.weight_sync.probe import raise_on_failure

    with pytest.raises(WeightSyncProbeError, match="trainer's weights were offloaded") as err:
        raise_on_failure(_result(3.0, 0.3, "mean", 0.1), [_ChecksumEngine({})], [1], None, 5,
                         ("bfloat16", "bfloat16"), unnamed_why="the trainer's weights were offloaded ...")
    assert err.value.tensors is None and "mean |Δ log p| 0.3 > tolerance 0.1" in str(err.value)


def test_an_offloaded_rank_refuses_to_read_its_weights():
    """N4: MegatronRank reads no weight whose storage the hosted trainer released."""
    from types import SimpleNamespace

    import torch

    from lean_rl.backends.megatron.rank import MegatronRank

    rank = MegatronRank.__new__(MegatronRank)
    rank.rank, rank.model = 3, torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(offloaded=False)
    rank.hosted = {SimpleNamespace: trainer}
    assert rank._require_weights() is rank.model
    trainer.offloaded = True
    assert rank._require_model() is rank.model  # metadata (dtypes) is still readable
    with pytest.raises(RuntimeError, match="rank 3: the weights are offloaded"):
        rank._require_weights()
