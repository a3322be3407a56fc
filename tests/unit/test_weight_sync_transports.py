"""The weight-sync transports as one type: the resolver (config.resolve_transport, then
transports.transport_for) maps --weight-sync-transport to a class, each class checks its own devices,
and no transport name is compared anywhere else in lean_rl (an `ast` scan, like the string-call
checker of test_import_graph.py), so that a new transport is one new class in one file."""

from __future__ import annotations

import ast
import logging
import pickle
from pathlib import Path

import pytest

import lean_rl
from lean_rl.backends.megatron.hf_weights.families import LAYER_RULES, lora_hf_modules_differ
from lean_rl.backends.megatron.lora_config import LORA_HF_MODULES, LoraConfig
from lean_rl.backends.sglang.lora import ServedAdapter
from lean_rl.options import ConfigError, build
from lean_rl.weight_sync.config import TRANSPORTS, WeightSyncConfig, resolve_lora_sync, resolve_transport
from lean_rl.weight_sync.errors import WeightSyncError
from lean_rl.weight_sync.rank import RankSyncPlan
from lean_rl.weight_sync.transports import TRANSPORT_CLASSES, transport_for
from lean_rl.weight_sync.transports.adapter import AdapterTransport
from lean_rl.weight_sync.transports.disk import DiskTransport
from lean_rl.weight_sync.transports.distributed import DistributedTransport
from lean_rl.weight_sync.transports.tensor import TensorTransport

ROOT = Path(lean_rl.__file__).resolve().parent
# where a transport name may be compared: the resolver, (file relative to lean_rl's parent, function)
RESOLVER = (("lean_rl/weight_sync/config.py", "resolve_transport"),
            ("lean_rl/weight_sync/config.py", "resolve_lora_sync"))


# ---------------------------------------------------------------- no transport name compared elsewhere
def _names_a_transport(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TRANSPORTS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_transport(element) for element in node.elts)
    return False


def transport_comparisons(root: Path = ROOT, allowed=RESOLVER) -> list[str]:
    """Comparisons (==, !=, in, not in, ...) and `match` cases against a transport's name, e.g.
    `cfg.transport == "disk"` or `plan.transport in ("distributed", "tensor")`, outside the functions
    in `allowed`: what a transport does belongs in its class (weight_sync/transports/)."""
    found = []

    def visit(node: ast.AST, path: str, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name if function is None else function  # a nested function is its outer one's
        compared = []
        if isinstance(node, ast.Compare):
            compared = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            compared = [node.value]
        if any(map(_names_a_transport, compared)) and (path, function) not in allowed:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, path, function)

    for file in sorted(root.rglob("*.py")):
        path = str(file.relative_to(root.parent))
        visit(ast.parse(file.read_text(), filename=path), path, None)
    return found


def test_no_transport_name_is_compared_outside_the_resolver():
    assert transport_comparisons() == []


def test_the_resolver_is_where_the_scan_allows_comparisons():
    # the allowance names a function that exists and compares names (else it is stale, or too wide)
    assert [line.split(":")[0] for line in transport_comparisons(allowed=())] != []
    assert {line.split(":")[0] for line in transport_comparisons(allowed=())} == {path for path, _ in RESOLVER}


def test_the_comparison_checker_finds_each_form(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        'if cfg.transport == "disk":\n    pass\n'
        'def send(plan):\n    return plan.transport not in ("distributed", "tensor")\n'
        'match name:\n    case "tensor":\n        pass\n'
        'def resolve_transport(requested):\n    return requested == "tensor"\n'
        'kind = "tensor"\nif kind == "auto" or x == "tensors":\n    pass\n')
    found = transport_comparisons(tmp_path / "pkg", allowed=(("pkg/m.py", "resolve_transport"),))
    assert [line.split(": ", 1)[0] for line in found] == ["pkg/m.py:1", "pkg/m.py:4", "pkg/m.py:6"]


# ---------------------------------------------------------------- the resolver: flag value -> class
def test_every_flag_choice_has_one_class_in_a_file_of_its_own():
    assert tuple(TRANSPORT_CLASSES) == TRANSPORTS  # config.py declares the choices; the registry holds the classes
    assert TRANSPORT_CLASSES == {"distributed": DistributedTransport, "tensor": TensorTransport, "disk": DiskTransport,
                                 "adapter": AdapterTransport}
    for name, cls in TRANSPORT_CLASSES.items():
        assert cls.name == name and cls.__module__ == f"lean_rl.weight_sync.transports.{name}"


@pytest.mark.parametrize("flags, expected", [
    ({}, DistributedTransport),
    ({"colocate": True}, TensorTransport),
    ({"transport": "disk", "colocate": True}, DiskTransport),
    ({"colocate": True, "device": "cuda"}, TensorTransport),
    ({"colocate": True, "device": "cuda", "ipc_unserved": "engine 1 sees GPU 1 only"}, DiskTransport),
    ({"device": "cuda"}, DistributedTransport),
])
def test_the_flag_resolves_to_a_class(flags, expected):
    name = build(WeightSyncConfig, **flags).transport
    first, second = transport_for(name), transport_for(name)
    assert type(first) is expected
    assert first is not second  # the driver half keeps one WeightSync's state: never shared


def test_an_unresolved_or_unknown_name_is_refused():
    with pytest.raises(WeightSyncError, match="--weight-sync-transport: no transport 'auto'"):
        transport_for("auto")
    with pytest.raises(WeightSyncError, match="no transport 'carrier-pigeon' .known: distributed, tensor, disk, adapter"):
        transport_for("carrier-pigeon")


def test_an_adapter_to_serve_makes_the_transport_the_adapter_one_whatever_the_flag_says():
    adapter = ServedAdapter(rank=8, alpha=16.0, target_modules=("q_proj", "o_proj"))
    for flags in ({}, {"colocate": True}, {"transport": "disk"}):
        assert build(WeightSyncConfig, adapter=adapter, **flags).transport == "adapter"
    assert AdapterTransport.sends_adapter and not DistributedTransport.sends_adapter
    with pytest.raises(ConfigError, match="expected one of auto, distributed, tensor, disk, got 'adapter'"):  # --lora-sync picks it
        build(WeightSyncConfig, transport="adapter")


def _lora(rank: int = 8, **kw) -> LoraConfig:
    return build(LoraConfig, lora_rank=rank, **kw)


def test_lora_sync_auto_serves_the_adapter_unless_the_run_needs_merged_weights(caplog):
    with caplog.at_level(logging.INFO, logger="lean_rl.weight_sync.config"):
        adapter = resolve_lora_sync("auto", _lora(8, lora_target_modules=("linear_qkv", "linear_fc2")), False, "off")
    assert adapter == ServedAdapter(8, 16.0, ("q_proj", "k_proj", "v_proj", "down_proj"))
    assert "the adapters only (rank 8" in caplog.text
    assert resolve_lora_sync("auto", _lora(4, lora_alpha=4.0), False, "one-step").alpha == 4.0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lean_rl.weight_sync.config"):
        assert resolve_lora_sync("auto", _lora(), True, "off") is None
        assert resolve_lora_sync("auto", _lora(), False, "full") is None
        assert resolve_lora_sync("merged", _lora(), False, "off") is None
    assert [r.getMessage().split(": ", 2)[1][:30] for r in caplog.records] == [
        "merged weights, every weight e"] * 3
    assert "a MoE model" in caplog.records[0].getMessage() and "--async-mode full" in caplog.records[1].getMessage()
    assert resolve_lora_sync("auto", _lora(0), False, "off") is None  # no LoRA: nothing to say


def test_lora_sync_adapter_is_refused_where_it_cannot_serve():
    with pytest.raises(ConfigError, match="--lora-sync adapter needs --lora-rank > 0"):
        resolve_lora_sync("adapter", _lora(0), False, "off")
    with pytest.raises(ConfigError, match="--lora-sync adapter cannot serve a MoE model"):
        resolve_lora_sync("adapter", _lora(), True, "off")
    with pytest.raises(ConfigError, match="--lora-sync adapter cannot serve --async-mode full"):
        resolve_lora_sync("adapter", _lora(), False, "full")


def test_the_hf_modules_of_each_lora_target_are_those_of_every_family_table():
    for family, rules in LAYER_RULES.items():
        for target, modules in LORA_HF_MODULES.items():
            dense = [r for r in rules if r.megatron.endswith(f".{target}.weight") and not r.per_expert]
            if dense and family != "glm4":  # a MoE family's MLP targets are experts (merged sync)
                assert tuple(hf.split(".")[-2] for hf in dense[0].hf) == modules, (family, target)
    # GLM-4's fused gate_up_proj: its adapter is synced merged (auto), refused as an adapter
    assert lora_hf_modules_differ("glm4", LORA_HF_MODULES) == (
        "a glm4 model (linear_fc1 is HF gate_up_proj, not gate_proj, up_proj)")
    assert lora_hf_modules_differ("glm4", {"linear_qkv": LORA_HF_MODULES["linear_qkv"]}) is None
    assert resolve_lora_sync("auto", _lora(), False, "off", lora_hf_modules_differ("glm4", LORA_HF_MODULES)) is None
    with pytest.raises(ConfigError, match="--lora-sync adapter cannot serve a glm4 model"):
        resolve_lora_sync("adapter", _lora(), False, "off", lora_hf_modules_differ("glm4", LORA_HF_MODULES))


def test_the_resolver_refuses_disk_on_a_cluster_without_a_shared_directory():
    with pytest.raises(ConfigError, match="--weight-sync-disk-dir"):
        resolve_transport("disk", colocate=False, on_cluster=True)
    with pytest.raises(ConfigError, match="--weight-sync-disk-dir"):  # auto picks disk, so it needs one too
        resolve_transport("auto", True, "cuda", "engine 1 sees GPU 1 only", on_cluster=True)
    assert resolve_transport("disk", colocate=False, on_cluster=True, disk_dir="/shared") == "disk"
    assert resolve_transport("auto", colocate=False, on_cluster=True) == "distributed"
    assert resolve_transport("disk", colocate=False, on_cluster=False) == "disk"  # a local temporary directory


# ---------------------------------------------------------------- each class's own checks
def test_each_transport_checks_its_devices():
    DistributedTransport().check("cpu", "cpu")
    DistributedTransport().check("cuda", "cuda")
    with pytest.raises(WeightSyncError, match="distributed: the trainer is on cpu, the engines on cuda"):
        DistributedTransport().check("cpu", "cuda")
    TensorTransport().check("cuda", "cuda")
    TensorTransport().check("cpu", "cuda")  # on CPU the payload is inline: it reaches any engine
    with pytest.raises(WeightSyncError, match="tensor: CUDA IPC needs the engines on the GPU too"):
        TensorTransport().check("cuda", "cpu")
    for trainer, engines in [("cpu", "cuda"), ("cuda", "cpu"), ("cpu", "cpu")]:
        DiskTransport().check(trainer, engines)  # files reach any engine


def test_the_plan_carries_the_class_across_the_ray_hop():
    plan = RankSyncPlan(transport=DistributedTransport, engine_urls=("http://e0",), engine_tp_sizes=(1,),
                        buffer_size_bytes=1024, timeout_s=5.0, family="qwen2", group_prefix="ws", backend="gloo")
    assert pickle.loads(pickle.dumps(plan)).transport is DistributedTransport  # by reference, as Ray pickles it
