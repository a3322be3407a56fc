"""Megatron torch_dist checkpoint -> HF safetensors checkpoint, streaming.

Reads any torch_dist checkpoint of a supported family: one written by hf_to_megatron, or by the
trainer at any TP / PP / EP layout (with or without optimizer state, which is ignored). The HF side
(config.json, tokenizer files) comes from --hf-config, else from the checkpoint's hf_config/ folder.
Each HF tensor is read (one layer / expert of one stored tensor at a time), converted through the
weight tables, and streamed into safetensors shards of at most --max-shard-size, with an index. A
checkpoint of a LoRA run (--lora-rank) converts to the merged model: W + alpha / rank * B A per
adapted layer. A reward model's checkpoint (--loss-type rm_loss) converts to its family's
*ForSequenceClassification (score_head.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from lean_rl.backends.megatron.checkpoint_paths import HF_CONFIG_DIR, CheckpointError, find_checkpoint
from lean_rl.backends.megatron.hf_side_files import copy_side_files
from lean_rl.backends.megatron.config import MegatronConfig, ParallelConfig
from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import arch_from_hf_config, hf_family, load_hf_config
from lean_rl.backends.megatron.hf_weights.dist_keys import (EXTRA_STATE, DistEntry, dist_entries, is_model_key,
                                                         lora_keys, merge_lora)
from lean_rl.backends.megatron.hf_weights.families import geometry, weight_rules
from lean_rl.backends.megatron.hf_weights.layouts import Layout, hf_shapes, qkv_blocks, to_hf_tensors
from lean_rl.convert.dcp_io import DistCheckpointReader
from lean_rl.convert.hf_to_megatron import TORCH_DTYPES, config_dtype, ordered_instances
from lean_rl.convert.output_dir import atomic_output_dir
from lean_rl.convert.reused_buffer import ReusedBuffer
from lean_rl.convert.score_head import (HF_SCORE, SCORE_KEY, classification_config, is_reward_model,
                                        without_output_layer)
from lean_rl.convert.safetensors_io import (
    PlannedTensor,
    StreamingSafetensorsWriter,
    plan_shards,
    shard_file_name,
    write_index,
)

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' former save_pretrained default


def _find_hf_config(checkpoint: Path, hf_config: str | Path | None) -> Path:
    candidates = [Path(hf_config)] if hf_config else [checkpoint / HF_CONFIG_DIR, checkpoint.parent / HF_CONFIG_DIR]
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate
    if hf_config:
        raise CheckpointError(f"--hf-config {hf_config}: no config.json there")
    raise CheckpointError(f"{checkpoint} carries no {HF_CONFIG_DIR}/config.json; pass --hf-config DIR "
                          "(the HF model the checkpoint came from, for config.json and the tokenizer)")


def _check_stored(reader: DistCheckpointReader, entries: list[DistEntry], arch: ModelArch,
                  family: str, extra_keys: tuple[str, ...] = ()) -> tuple[dict[DistEntry, str], torch.dtype, dict[DistEntry, tuple[str, ...]]]:
    """Which stored key holds each entry; every model tensor of the checkpoint must be mapped and
    every entry present with the right shape. Returns (entry -> key, the checkpoint dtype, entry -> the
    keys of its LoRA adapter, for the entries of a LoRA-trained checkpoint that have one)."""
    stored = reader.tensors()
    chosen: dict[DistEntry, str] = {}
    for entry in entries:
        key = next((k for k in entry.keys if k in stored), None)
        if key is None:
            raise CheckpointError(f"{reader.directory}: tensor {entry.keys[0]} is missing (the {family} table "
                                  "needs it; a checkpoint of another architecture?)")
        shape, expected = tuple(stored[key].size), entry.global_shape(arch)
        if entry.rule.layout is Layout.VOCAB and shape[1:] == expected[1:]:
            if shape[0] < arch.vocab_size:
                raise CheckpointError(f"vocab size mismatch: {key} has {shape[0]} rows, the HF config says "
                                      f"vocab_size={arch.vocab_size}")
        elif shape != expected:
            raise CheckpointError(f"{key} is {list(shape)} in {reader.directory}; the HF config implies "
                                  f"{list(expected)}")
        chosen[entry] = key
    adapters = {entry: lora_keys(key) for entry, key in chosen.items() if lora_keys(key)[0] in stored}
    known = ({key for entry in entries for key in entry.keys} | {key for keys in adapters.values() for key in keys}
             | set(extra_keys))
    unmapped = [k for k in stored if is_model_key(k) and k not in known]
    unmapped += [k for k in reader.objects() if is_model_key(k) and f".{EXTRA_STATE}/" not in k]
    if unmapped:
        raise CheckpointError(f"{reader.directory} holds model tensors the {family} table does not map "
                              f"(wrong --hf-config?): {', '.join(sorted(unmapped)[:6])}")
    dtypes = {stored[key].properties.dtype for key in chosen.values()}
    if len(dtypes) != 1:
        raise CheckpointError(f"{reader.directory}: model tensors have mixed dtypes {sorted(map(str, dtypes))}")
    return chosen, dtypes.pop(), adapters


def _merge_lora(reader: DistCheckpointReader, stored: dict, keys: tuple[str, ...], index: tuple[int, ...],
                weight: torch.Tensor) -> torch.Tensor:
    """W + scaling * B A of one layer (`index`: its stacked offsets), merged as for the engines."""
    def one(key: str) -> torch.Tensor:
        size = tuple(stored[key].size)[len(index):]
        return reader.read(key, index + (0,) * len(size), (1,) * len(index) + size).reshape(size)

    a, b, scaling = (one(key) for key in keys)
    return merge_lora(weight, a, b, scaling.float())


def convert_megatron_to_hf(load: str | Path, save: str | Path, *, hf_config: str | Path | None = None,
                           iteration: int | None = None, dtype: torch.dtype | None = None,
                           max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Convert; returns `save`, which appears only when complete. Output dtype: `dtype`, else the HF
    config's declared dtype, else the checkpoint's."""
    _, checkpoint = find_checkpoint(load, iteration)  # a root (latest, or `iteration`) or one iter_* directory
    hf_dir = _find_hf_config(checkpoint, hf_config)
    config_json = load_hf_config(hf_dir)
    family = hf_family(config_json)
    arch = arch_from_hf_config(config_json)
    reader = DistCheckpointReader(checkpoint)
    rules = weight_rules(family, arch)
    reward_model = is_reward_model(reader.tensors())
    if reward_model:  # a value head in place of the vocabulary projection
        rules, config_json = without_output_layer(rules), classification_config(config_json)
    # The stored vocab rows are padded for whatever TP the checkpoint was made at; take them as found.
    vocab_keys = [e.keys[0] for e in dist_entries(rules, arch, arch.vocab_size) if e.rule.layout is Layout.VOCAB]
    stored = reader.tensors()
    padded_rows = max([stored[k].size[0] for k in vocab_keys if k in stored], default=arch.vocab_size)
    entries = dist_entries(rules, arch, padded_rows)
    keys, stored_dtype, adapters = _check_stored(reader, entries, arch, family,
                                                 (SCORE_KEY,) if reward_model else ())
    out_dtype = dtype or config_dtype(config_json) or stored_dtype
    geo = geometry(MegatronConfig(arch, ParallelConfig()))

    instances = ordered_instances(entries, arch)
    planned = []
    for inst in instances:
        shapes = hf_shapes(inst.entry.rule.layout, _read_shape(inst.entry, arch), geo)
        planned.append([PlannedTensor(name, out_dtype, shape) for name, shape in zip(inst.hf_names, shapes)])
    if reward_model:  # the last group: the score head
        planned.append([PlannedTensor(HF_SCORE, out_dtype, (1, arch.hidden_size))])
    shards = plan_shards([sum(t.nbytes for t in group) for group in planned], max_shard_bytes)
    shard_tensors = [[t for g in shard for t in planned[g]] for shard in shards]

    # every instance is read into one buffer: the writer writes its tensors before the next read (reused_buffer.py)
    def nbytes(inst) -> int:
        return math.prod(_read_shape(inst.entry, arch)) * stored[keys[inst.entry]].properties.dtype.itemsize

    buffer = ReusedBuffer(max(map(nbytes, instances), default=0))
    with atomic_output_dir(save) as out:
        for shard_index, shard in enumerate(shards):
            writer = StreamingSafetensorsWriter(out / shard_file_name(shard_index, len(shards)),
                                                shard_tensors[shard_index])
            try:
                for g in shard:
                    if g == len(instances):  # the reward model's score head
                        writer.write(HF_SCORE, reader.read(SCORE_KEY, (0, 0), (1, arch.hidden_size)).to(out_dtype))
                        continue
                    inst = instances[g]
                    region = _read_shape(inst.entry, arch)
                    sizes = (1,) * len(inst.entry.stacked) + region
                    tensor = reader.read(keys[inst.entry], inst.entry.chunk_offsets(inst.index), sizes,
                                         buffer.tensor).reshape(region)
                    if inst.entry in adapters:  # LoRA-trained: HF gets the merged weight
                        stacked = inst.entry.chunk_offsets(inst.index)[:len(inst.entry.stacked)]
                        tensor = _merge_lora(reader, stored, adapters[inst.entry], stacked, tensor)
                    if inst.entry.rule.layout is Layout.QKV:  # q, k, v: their groups' rows, written where they are
                        for name, blocks in zip(inst.hf_names, qkv_blocks(tensor, geo)):
                            writer.write_blocks(name, [block.to(out_dtype) for block in blocks])
                        continue
                    for name, hf_tensor in zip(inst.hf_names, to_hf_tensors(inst.entry.rule.layout, [tensor], geo)):
                        writer.write(name, hf_tensor.to(out_dtype))
                writer.close()
            except BaseException:
                writer.abort()
                raise
        write_index(out, shard_tensors)
        copy_side_files(hf_dir, out, skip=("config.json",))
        _write_config(config_json, out / "config.json", out_dtype, None if reward_model else hf_dir / "config.json")
    return Path(save)


def _read_shape(entry: DistEntry, arch: ModelArch) -> tuple[int, ...]:
    """The region of one instance to read: the parameter, with only the real vocab rows."""
    if entry.rule.layout is Layout.VOCAB:
        return (arch.vocab_size, *entry.param_shape[1:])
    return entry.param_shape


def _write_config(config: dict, path: Path, dtype: torch.dtype, original: Path | None) -> None:
    """The HF config, byte for byte when the dtype is unchanged (and `original` given), else with its
    dtype field updated."""
    name = next(n for n, d in TORCH_DTYPES.items() if d == dtype)
    field = "dtype" if "dtype" in config or "torch_dtype" not in config else "torch_dtype"
    if config.get(field) == name and original is not None:
        path.write_bytes(original.read_bytes())
        return
    path.write_text(json.dumps({**config, field: name}, indent=2, sort_keys=True) + "\n")
