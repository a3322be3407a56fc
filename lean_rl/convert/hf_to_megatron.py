"""HF safetensors checkpoint -> Megatron torch_dist checkpoint (model only), streaming.

Output (checkpoint_paths layout): SAVE/latest_checkpointed_iteration.txt and SAVE/iter_000000N/ holding
the dist checkpoint whose keys are those of GPTModel.sharded_state_dict() (under the top-level state
dict key "model"; no "optimizer"), plus SAVE/iter_000000N/hf_config/ (config.json, tokenizer files) so
that megatron_to_hf and the trainer find the HF side without being told.

A torch_dist checkpoint is layout-free: Megatron reshards on load, so the tensors are written at
TP=1 and the parallel flags only (a) validate that the model can be split that way and (b) choose the
vocab padding (--make-vocab-size-divisible-by x TP rows), which is part of the stored shape. Each
stored chunk (one layer / expert of one parameter) is built from its HF tensors only when the writer
asks for it; the writer cuts files at --max-shard-size (default: the largest input shard)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from lean_rl.backends.megatron.arch_flags import check_given_flags
from lean_rl.backends.megatron.checkpoint_paths import (
    HF_CONFIG_DIR,
    CheckpointError,
    iteration_dir,
    prepare_temporary_dir,
    publish,
)
from lean_rl.backends.megatron.hf_side_files import copy_side_files
from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, checkpoint_dtype, hf_family, load_hf_config
from lean_rl.backends.megatron.hf_weights.dist_keys import DistEntry, dist_entries, extra_state_keys
from lean_rl.backends.megatron.hf_weights.families import geometry, rule_instances, weight_rules
from lean_rl.backends.megatron.hf_weights.layouts import Layout, hf_shapes, to_megatron_shard
from lean_rl.convert.dcp_io import ChunkSpec, save_dist_checkpoint
from lean_rl.convert.fused_read import read_tp1
from lean_rl.convert.output_dir import atomic_output_dir
from lean_rl.convert.reused_buffer import ReusedBuffer
from lean_rl.convert.safetensors_io import HFSafetensors
from lean_rl.options import ConfigError

# Buffers some exporters write that carry no weights (recomputed by the model).
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _is_mtp_layer(name: str, hf_config: dict) -> bool:
    """A tensor of the multi-token-prediction layers (GLM-4.5, DeepSeek-V3: `num_nextn_predict_layers`
    layers stored after the last decoder layer). They take no part in the model's log-probs, so the
    converter leaves them out (not converted, not trained)."""
    match = re.match(r"model\.layers\.(\d+)\.", name)
    return bool(match and hf_config.get("num_nextn_predict_layers")
                and int(match[1]) >= int(hf_config["num_hidden_layers"]))


def parse_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ConfigError(f"--dtype {name!r}: choose one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def config_dtype(config: Mapping[str, Any]) -> torch.dtype | None:
    """The dtype an HF config declares (`dtype`, or `torch_dtype` before transformers 5), if any."""
    return TORCH_DTYPES.get(checkpoint_dtype(config))


@dataclass(frozen=True)
class RuleInstance:
    """One stored chunk's worth of a rule: its dist entry at one {layer, expert}."""

    entry: DistEntry
    index: dict[str, int]

    @property
    def hf_names(self) -> tuple[str, ...]:
        return self.entry.rule.hf_names(**self.index)


def ordered_instances(entries: list[DistEntry], arch: ModelArch) -> list[RuleInstance]:
    """Every stored (rule, layer, expert), layer by layer (the order HF checkpoints are written in)."""
    # one entry per rule, or per (rule, layer) where layers have keys of their own (dist_keys.py)
    by_rule = {(entry.rule, entry.layer): entry for entry in entries}
    rules = tuple(dict.fromkeys(entry.rule for entry in entries))
    position = {rule: i for i, rule in enumerate(rules)}
    instances = [RuleInstance(by_rule.get((rule, index.get("layer"))) or by_rule[(rule, None)], index)
                 for rule, index in rule_instances(rules, arch)]

    def order(inst: RuleInstance):
        layer = inst.index.get("layer")
        band = 0 if position[inst.entry.rule] == 0 else (1 if layer is not None else 2)
        return band, layer or 0, position[inst.entry.rule], inst.index.get("expert") or 0

    return sorted(instances, key=order)


def _check_source(source: HFSafetensors, instances: list[RuleInstance], config: MegatronConfig, hf_config: dict,
                  tied: bool) -> torch.dtype:
    """Names, shapes and dtypes of the HF tensors against the architecture; returns their dtype."""
    expected: dict[str, tuple[int, ...]] = {}
    layouts: dict[str, Layout] = {}
    for inst in instances:
        shapes = hf_shapes(inst.entry.rule.layout, inst.entry.param_shape, geometry(config))
        for name, shape in zip(inst.hf_names, shapes):
            expected[name], layouts[name] = shape, inst.entry.rule.layout
    missing = [name for name in expected if name not in source.tensors]
    if missing:
        raise CheckpointError(f"{source.directory}: {len(missing)} tensor(s) the {hf_config['model_type']} table needs "
                              f"are missing: {', '.join(missing[:6])}" + (" ..." if len(missing) > 6 else ""))
    extra = [n for n in source.tensors if n not in expected and not n.endswith(_IGNORED_HF_SUFFIXES)
             and not _is_mtp_layer(n, hf_config)]
    if tied and "lm_head.weight" in extra:
        if not torch.equal(source.read("lm_head.weight"), source.read("model.embed_tokens.weight")):
            raise CheckpointError(f"{source.directory}: tie_word_embeddings is true but lm_head.weight differs "
                                  "from model.embed_tokens.weight")
        extra.remove("lm_head.weight")
    if extra:
        raise CheckpointError(f"{source.directory}: {len(extra)} tensor(s) the {hf_config['model_type']} table does "
                              f"not map (a different architecture?): {', '.join(extra[:6])}")
    for name, shape in expected.items():
        info = source.tensors[name]
        if info.shape == shape:
            continue
        if layouts[name] is Layout.VOCAB and info.shape[1:] == shape[1:]:
            raise CheckpointError(f"vocab size mismatch: config.json has vocab_size={hf_config['vocab_size']} but "
                                  f"{name} has {info.shape[0]} rows ({info.path})")
        raise CheckpointError(f"{name} is {list(info.shape)} in {info.path}; the HF config implies {list(shape)}")
    declared = config_dtype(hf_config)
    first = source.tensors[next(iter(expected))]
    reference = declared or first.dtype
    for name in expected:
        info = source.tensors[name]
        if info.dtype != reference:
            what = f"config.json declares {reference}" if declared else f"{first.name} is {first.dtype}"
            raise CheckpointError(f"dtype mismatch: {name} is {info.dtype} ({info.path}) but {what}; "
                                  "every weight must have one dtype")
    return reference


def convert_hf_to_megatron(hf_dir: str | Path, save: str | Path, *, parallel: ParallelConfig = ParallelConfig(),
                           make_vocab_size_divisible_by: int = 128, dtype: torch.dtype | None = None,
                           max_file_bytes: int | None = None, iteration: int = 0,
                           given_flags: Mapping[str, Any] | None = None) -> Path:
    """Convert; returns the iteration directory. `given_flags` (dest -> value of Megatron model flags
    the user typed) must agree with the HF config. Everything is checked before anything is written;
    `save` appears only when complete."""
    hf_dir = Path(hf_dir)
    hf_config = load_hf_config(hf_dir)
    family = hf_family(hf_config)
    arch = arch_from_hf_config(hf_config, make_vocab_size_divisible_by)
    if given_flags:
        arch = check_given_flags(given_flags, arch, str(hf_dir))
    if arch.is_moe and parallel.tensor_model_parallel_size > 1:
        parallel = dataclasses.replace(parallel, sequence_parallel=True)  # required by MoE + TP; not stored
    config = MegatronConfig(arch, parallel)  # TP / PP / EP must split the model
    rules = weight_rules(family, arch)
    entries = dist_entries(rules, arch, config.padded_vocab_size)
    instances = ordered_instances(entries, arch)
    source = HFSafetensors(hf_dir)
    source_dtype = _check_source(source, instances, config, hf_config, not arch.untie_embeddings_and_output_weights)
    out_dtype = dtype or source_dtype
    geo = geometry(config)

    chunks: list[ChunkSpec] = []
    producers: dict[tuple[str, tuple[int, ...]], RuleInstance] = {}
    for inst in instances:
        for key in inst.entry.keys:
            spec = ChunkSpec(key, inst.entry.global_shape(arch), inst.entry.chunk_offsets(inst.index),
                             inst.entry.chunk_sizes(), out_dtype)
            chunks.append(spec)
            producers[(spec.key, spec.offsets)] = inst

    # every chunk is built in one buffer: the writer writes each before it asks for the next (reused_buffer.py)
    buffer = ReusedBuffer(max((spec.nbytes for spec in chunks), default=0))

    def produce(spec: ChunkSpec) -> torch.Tensor:
        inst = producers[(spec.key, spec.offsets)]
        tensor = read_tp1(inst.entry.rule.layout, [source.tensors[name] for name in inst.hf_names], geo, out_dtype,
                          buffer.tensor)
        if tensor is None:
            tensor = to_megatron_shard(inst.entry.rule.layout, [source.read(name) for name in inst.hf_names], 0, 1, geo)
        return tensor.to(out_dtype).reshape(spec.sizes)

    budget = max_file_bytes or source.largest_file_bytes()
    objects = {key: [None] for key in extra_state_keys(rules, arch)}  # local-spec extra state is None
    with atomic_output_dir(save) as root:
        written = prepare_temporary_dir(root, iteration)
        save_dist_checkpoint(written, chunks, produce, objects, budget)
        copy_side_files(hf_dir, written / HF_CONFIG_DIR)
        publish(root, iteration, written)
    return iteration_dir(save, iteration)

