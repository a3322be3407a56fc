"""Model-only torch_dist checkpoints on the Megatron side (collective: every rank calls these).

The agreed format (the same as lean_rl.convert writes): checkpoint_paths layout, one dist checkpoint
per iteration whose state dict is {"model": GPTModel.sharded_state_dict()} (default metadata) and no
"optimizer" key; the HF config + tokenizer may sit in iter_*/hf_config/. The trainer's full
checkpoints can reuse `adapt_model_request` for their "model" part, so that they load converted
checkpoints too.

`adapt_model_request` makes loading tolerant of four differences that carry no weights:
- the MoE pre-MLP norm is keyed differently by the local and TE layer specs (dist_keys.py): read it
  from whichever name the checkpoint has;
- the vocab rows of the embedding / output layer are padded for the TP a checkpoint was made at:
  read the rows that exist (Megatron's allow_shape_mismatch zero-fills the rest, which is padding
  as long as the real vocab is stored, checked when vocab_size is given);
- LoRA adapters (lora.py) the checkpoint lacks, when it is one of the base model: they start afresh;
- `_extra_state` objects the checkpoint lacks (TE-only ones, or a checkpoint from the other spec)
  are not requested: they hold no weights (None for the local spec, FP8 scaling state for TE)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, ShardedTensorFactory
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata

from lean_rl.backends.megatron import lora
from lean_rl.backends.megatron.checkpoint_paths import (
    HF_CONFIG_DIR,
    find_checkpoint,
    prepare_temporary_dir,
    publish,
)
from lean_rl.backends.megatron.hf_side_files import copy_side_files
from lean_rl.backends.megatron.hf_weights.dist_keys import EXTRA_STATE

MODEL_KEY = "model"
_VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")
# The two dist-checkpoint names of a MoE layer's pre-MLP norm (local spec, TE spec).
_ALIASES = {"decoder.layers.mlp.linear_fc1.layer_norm_weight": "decoder.layers.pre_mlp_layernorm.weight",
            "decoder.layers.pre_mlp_layernorm.weight": "decoder.layers.mlp.linear_fc1.layer_norm_weight"}


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while hasattr(model, "module"):
        model = model.module
    return model


def read_checkpoint_metadata(directory: str | Path) -> Metadata:
    """The torch.distributed.checkpoint metadata (keys, global shapes, chunks) of a dist checkpoint."""
    return FileSystemReader(str(directory)).read_metadata()


def adapt_model_request(sharded_state_dict: dict, metadata: Metadata, vocab_size: int | None = None,
                        source: str | Path = "the checkpoint") -> dict:
    """GPTModel.sharded_state_dict() adapted to what `metadata`'s checkpoint holds (see module doc).
    ArchitectureMismatch, before anything is read, when the checkpoint (`source`) is of another model."""
    stored = metadata.state_dict_metadata
    lora.check_request([item.key for item in sharded_state_dict.values()], list(stored), source)
    adapted, mismatches = {}, {}  # key -> what differs (one entry per key: layers share theirs)
    for name, item in sharded_state_dict.items():
        if lora.is_adapter_key(name) and item.key not in stored:
            continue  # a checkpoint of the base model: lora.after_load starts these adapters afresh
        if isinstance(item, ShardedObject):
            if item.unique_key not in stored and item.key.endswith(EXTRA_STATE):
                continue
        elif isinstance(item, (ShardedTensor, ShardedTensorFactory)) and item.key not in stored:
            alias = _ALIASES.get(item.key)
            if alias in stored:
                item.key = alias
        if isinstance(item, ShardedTensor):
            mismatch = _mismatch(item, stored, vocab_size)
            if mismatch:
                mismatches[item.key] = mismatch
            elif item.key in _VOCAB_KEYS and stored[item.key].size[0] != item.global_shape[0]:
                item.allow_shape_mismatch = True
        adapted[name] = item
    if mismatches:
        raise ArchitectureMismatch(
            f"{source}: the checkpoint does not match --hf-checkpoint's architecture (another hidden size, vocab, "
            f"layers or heads?): {'; '.join(sorted(mismatches.values())[:4])}"
            f"{f' (and {len(mismatches) - 4} more)' if len(mismatches) > 4 else ''}")
    return adapted


class ArchitectureMismatch(ValueError):
    """A checkpoint made for another model than the one being loaded into."""


def _mismatch(item: ShardedTensor, stored: dict, vocab_size: int | None) -> str | None:
    """What differs between the model's tensor `item` and the checkpoint's (None: they fit). Vocab rows
    may differ (padding for another TP) as long as the checkpoint has at least `vocab_size` of them."""
    if item.key not in stored:
        return f"{item.key} is not in the checkpoint"
    if not hasattr(stored[item.key], "size"):
        return f"{item.key} is not a tensor in the checkpoint"
    have, want = list(stored[item.key].size), list(item.global_shape)
    if item.key in _VOCAB_KEYS and len(have) == len(want) and have[1:] == want[1:]:
        if vocab_size is not None and have[0] < vocab_size:
            return f"{item.key} has {have[0]} rows in the checkpoint, fewer than the vocab size {vocab_size}"
        return None
    if have != want:
        return f"{item.key} is {have} in the checkpoint, {want} in the model"
    return None


def load_model_checkpoint(model: torch.nn.Module, path: str | Path, step: int | None = None,
                          vocab_size: int | None = None) -> Path:
    """Load the weights of a model-only (or full: only "model" is read) checkpoint into this rank's
    model, resharding from whatever layout wrote it. `path`: a root (its latest, or `step`) or one
    iter_* directory. Returns the directory loaded."""
    _, directory = find_checkpoint(path, step)
    model = _unwrap(model)
    request = adapt_model_request(model.sharded_state_dict(), read_checkpoint_metadata(directory), vocab_size,
                                  source=directory)
    state = dist_checkpointing.load({MODEL_KEY: request}, str(directory))
    missing, unexpected = model.load_state_dict(state[MODEL_KEY], strict=False)
    wrong = [k for k in [*lora.after_load(model, missing), *unexpected] if not k.endswith(EXTRA_STATE)]
    if wrong:
        raise RuntimeError(f"{directory}: model state does not match the checkpoint: {', '.join(wrong[:6])}")
    return directory


def save_model_checkpoint(model: torch.nn.Module, root: str | Path, step: int,
                          hf_config_dir: str | Path | None = None) -> Path:
    """Write {"model": sharded state dict} as iteration `step` under `root` (written to
    iter_*.tmp, published when every rank is done); with hf_config_dir, its config and tokenizer go to
    iter_*/hf_config/ so that megatron_to_hf needs no --hf-config. Returns the published directory."""
    rank = dist.get_rank()
    written = prepare_temporary_dir(root, step) if rank == 0 else None
    shared = [written]
    dist.broadcast_object_list(shared, src=0)
    written = shared[0]
    dist_checkpointing.save({MODEL_KEY: _unwrap(model).sharded_state_dict()}, str(written))
    dist.barrier()
    final = [None]
    if rank == 0:
        if hf_config_dir is not None:
            copy_side_files(hf_config_dir, Path(written) / HF_CONFIG_DIR)
        final = [publish(root, step, Path(written))]
    dist.broadcast_object_list(final, src=0)
    return final[0]

