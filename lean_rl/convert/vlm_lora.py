"""A vision-language checkpoint of a LoRA run (--lora-rank: adapters on the language model, the tower
frozen) converts to the merged model, as the text converter does (megatron_to_hf.py): before loading,
the model gets the adapters the checkpoint stores (their rank, targets and alpha / rank read from it),
and the export writes W + alpha / rank * B A under the base names (lora.export_weight)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from lean_rl.backends.megatron import lora
from lean_rl.backends.megatron.lora_config import LoraConfig
from lean_rl.convert.dcp_io import DistCheckpointReader

_ADAPTER_A = re.compile(rf"^decoder\.layers\.(?:self_attention|mlp)\.(linear_\w+)\.{lora.ADAPTER}\.a$")


def stored_lora(directory: str | Path) -> LoraConfig | None:
    """The LoRA config a checkpoint's language-model adapters were trained with (None: it has none)."""
    reader = DistCheckpointReader(directory)
    stored = reader.tensors()
    targets = {m[1]: key for key in stored if (m := _ADAPTER_A.match(key))}
    if not targets:
        return None
    first = next(iter(targets.values()))
    rank = int(stored[first].size[-2])  # A: [layers, rank, in]
    scaling_key = first[:-len(".a")] + ".scaling"  # [layers, 1]
    scaling = float(reader.read(scaling_key, (0, 0), (1, 1)).reshape(()).to(torch.float64))
    return LoraConfig(lora_rank=rank, lora_alpha=scaling * rank, lora_target_modules=tuple(sorted(targets)))


def add_stored_adapters(model: torch.nn.Module, directory: str | Path) -> bool:
    """Add the checkpoint's adapters to `model` (built without them) so that it loads; True if any."""
    config = stored_lora(directory)
    if config is None:
        return False
    lora.add_adapters(model, config, seed=0)  # every value is then loaded from the checkpoint
    return True
