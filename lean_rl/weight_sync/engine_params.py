"""Which SGLang parameter each HF tensor ends up in, and the checksum SGLang will report for it.

SGLang's load_weights fuses HF tensors: q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj, and
every expert's gate/up -> experts.w13_weight, down -> experts.w2_weight (checked on 0.5.23 with the
tiny qwen2 and qwen3_moe models: on an engine with TP 1 each fused parameter is the concatenation,
along dim 0, of its parts in this order). Its /weights_checker endpoint reports a hash of each
parameter's bytes. Hashing the trainer's tensors the same way tells, after a failed probe, exactly
which parameters differ between trainer and engine, for any model whose fusion follows these names.
Pure functions, plus the optional GPU hash (see tensor_bytes_hash).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable

import torch

# sglang/srt/layers/vocab_parallel_embedding.py:48 DEFAULT_VOCAB_PADDING_SIZE and :447: the engine
# pads the vocab dim of the embedding and the LM head to a multiple of 64 with zero rows.
ENGINE_VOCAB_PADDING = 64
_VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")

_FUSED = (  # (HF name pattern, engine name template, parts in the order SGLang concatenates them)
    (re.compile(r"(?P<p>.*\.)(?P<part>q|k|v)_proj\.(?P<kind>weight|bias)$"), "{p}qkv_proj.{kind}", ("q", "k", "v")),
    (re.compile(r"(?P<p>.*\.mlp\.experts\.)(?P<e>\d+)\.(?P<part>gate|up)_proj\.weight$"), "{p}w13_weight",
     ("gate", "up")),
    (re.compile(r"(?P<p>.*\.mlp\.experts\.)(?P<e>\d+)\.down_proj\.weight$"), "{p}w2_weight", None),
    # Mixtral (sglang/srt/models/mixtral.py load_weights: w1 gate, w3 up, w2 down)
    (re.compile(r"(?P<p>.*\.block_sparse_moe\.experts\.)(?P<e>\d+)\.(?P<part>w1|w3)\.weight$"), "{p}w13_weight",
     ("w1", "w3")),
    (re.compile(r"(?P<p>.*\.block_sparse_moe\.experts\.)(?P<e>\d+)\.w2\.weight$"), "{p}w2_weight", None),
    # the vision MLP of Qwen2.5-VL has biases, fused like the weights (sglang/srt/models/qwen2_5_vl.py:906)
    (re.compile(r"(?P<p>.*\.)(?P<part>gate|up)_proj\.(?P<kind>weight|bias)$"), "{p}gate_up_proj.{kind}",
     ("gate", "up")),
    # Qwen2.5-VL's vision attention: HF's fused attn.qkv is SGLang's attn.qkv_proj (qwen2_5_vl.py load_weights)
    (re.compile(r"(?P<p>visual\..*\.attn\.)(?P<part>qkv)\.(?P<kind>weight|bias)$"), "{p}qkv_proj.{kind}", ("qkv",)),
)


@dataclass(frozen=True)
class EngineSlot:
    engine_name: str  # SGLang's parameter name
    position: int  # where this HF tensor goes among the parameter's parts
    num_parts: int


def engine_slot(hf_name: str, num_experts: int | None) -> EngineSlot:
    """Where HF tensor `hf_name` lands in the engine (experts are fused across all `num_experts`)."""
    for pattern, template, parts in _FUSED:
        match = pattern.match(hf_name)
        if match is None:
            continue
        groups = match.groupdict()
        name = template.format(**groups)
        if "e" not in groups:  # a non-expert pattern always lists its parts
            assert parts is not None, template
            return EngineSlot(name, parts.index(groups["part"]), len(parts))
        if not num_experts:
            raise ValueError(f"{hf_name} is an expert tensor but the model has no --num-experts")
        expert = int(groups["e"])
        if parts is None:  # w2: one part per expert
            return EngineSlot(name, expert, num_experts)
        return EngineSlot(name, expert * len(parts) + parts.index(groups["part"]), num_experts * len(parts))
    return EngineSlot(hf_name, 0, 1)


def tensor_bytes_hash(parts: list[torch.Tensor]) -> str:
    """The hash SGLang's /weights_checker reports for a parameter whose bytes are `parts` back to back.
    CPU: sglang/srt/utils/weight_checker.py:_hash_tensor -> sglang/srt/managers/mm_utils.py:tensor_hash,
    the first 8 bytes of a sha256 of the raw bytes, big-endian, as 16 hex digits. CUDA: SGLang hashes
    with its own Triton kernel over the same bytes; it is imported from SGLang (GPU trainers have it)."""
    if parts and parts[0].is_cuda:  # not exercised on the CPU-only machines this was written on
        from sglang.kernels.ops.memory.gpu_tensor_hash import gpu_tensor_hash

        flat = torch.cat([p.detach().contiguous().reshape(-1).view(torch.uint8) for p in parts])
        return f"{gpu_tensor_hash(flat):016x}"
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(memoryview(part.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
    return hasher.digest()[:8].hex()


class EngineChecksums:
    """Feed the trainer's HF tensors in any order; get {engine parameter: hash} for every parameter
    whose parts all arrived. Holds only the parts of incomplete fused parameters."""

    def __init__(self, num_experts: int | None):
        self.num_experts = num_experts
        self._parts: dict[str, dict[int, torch.Tensor]] = {}
        self._sizes: dict[str, int] = {}
        self.checksums: dict[str, str] = {}
        self.sources: dict[str, list[str]] = {}  # engine name -> HF names, for error messages

    def add(self, hf_name: str, tensor: torch.Tensor) -> None:
        slot = engine_slot(hf_name, self.num_experts)
        if hf_name in _VOCAB_TENSORS:
            tensor = _pad_rows(tensor, ENGINE_VOCAB_PADDING)
        parts = self._parts.setdefault(slot.engine_name, {})
        if slot.position in parts:
            raise ValueError(f"{hf_name}: its place in {slot.engine_name} was already filled")
        parts[slot.position] = tensor
        self._sizes[slot.engine_name] = slot.num_parts
        self.sources.setdefault(slot.engine_name, []).append(hf_name)
        if len(parts) == slot.num_parts:
            ordered = [parts[i] for i in range(slot.num_parts)]
            self.checksums[slot.engine_name] = tensor_bytes_hash(ordered)
            del self._parts[slot.engine_name]

    def incomplete(self) -> list[str]:
        return sorted(self._parts)


def _pad_rows(tensor: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -tensor.shape[0] % multiple
    if not extra:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(extra, *tensor.shape[1:])])


@dataclass(frozen=True)
class ChecksumDiff:
    differing: list[str]  # engine parameters whose bytes differ from the trainer's
    missing_on_engine: list[str]  # the trainer has them, the engine does not report them
    compared: int


def compare_checksums(trainer: dict[str, str], engine: dict[str, str],
                      order: Iterable[str] | None = None) -> ChecksumDiff:
    """Parameters the engine reports but the trainer does not produce (e.g. a tied lm_head, buffers)
    are not compared. `order`: how to list the differences (default: the engine's order)."""
    names = [n for n in (order or engine) if n in engine and n in trainer]
    differing = [n for n in names if engine[n] != trainer[n]]
    missing = sorted(set(trainer) - set(engine))
    return ChecksumDiff(differing=differing, missing_on_engine=missing, compared=len(names))
