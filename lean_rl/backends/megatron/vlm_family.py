"""Vision-language families (issue 44): one entry per HF `model_type`, naming the text family whose
Megatron architecture and weight table its language model reuses, the HF prefix of its vision tower and
the transformers class that runs that tower. The language model's config.json fields sit under
`text_config`; `text_config_of` turns them into the text family's own config.json, so hf_config.py and
families.py stay the single mapping of the language side (their text family's entry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from lean_rl.backends.megatron.model_arch import ModelArch
from lean_rl.backends.megatron.hf_config import (VLM_TEXT_FAMILIES, arch_from_hf_config, load_hf_config,
                                                 text_config_of)
from lean_rl.options import ConfigError


def _qwen2_5_vl_tower(vision_config: dict[str, Any]) -> torch.nn.Module:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLVisionConfig(**vision_config)
    config._attn_implementation = "sdpa"  # what from_pretrained picks on CPU and GPU alike
    return Qwen2_5_VisionTransformerPretrainedModel(config)


@dataclass(frozen=True)
class VLMFamily:
    text_family: str  # hf_config.py / families.py entry of the language model
    vision_prefix: str  # HF tensor-name prefix of the vision tower ("visual.")
    vision_tower: Callable[[dict[str, Any]], torch.nn.Module]  # transformers' tower from vision_config


VLM_FAMILIES = {
    "qwen2_5_vl": VLMFamily(text_family=VLM_TEXT_FAMILIES["qwen2_5_vl"], vision_prefix="visual.", vision_tower=_qwen2_5_vl_tower),
}
assert set(VLM_FAMILIES) == set(VLM_TEXT_FAMILIES), "a VLM family needs both entries"
# Megatron-side name of the (HF) vision tower inside VisionLanguageModel; the language model's
# parameters are GPTModel's under LANGUAGE_PREFIX.
VISION_PREFIX = "vision_model."
LANGUAGE_PREFIX = "language_model."


def is_vlm_config(path_or_dict: str | Path | Mapping[str, Any]) -> bool:
    return load_hf_config(path_or_dict).get("model_type") in VLM_FAMILIES


def vlm_config_or_none(path_or_dict: str | Path | Mapping[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's config when it is a vision-language one (MegatronConfig.vlm_hf_config), else None."""
    config = load_hf_config(path_or_dict)
    return config if config.get("model_type") in VLM_FAMILIES else None


def vlm_family(hf_config: Mapping[str, Any]) -> VLMFamily:
    family = hf_config.get("model_type")
    if family not in VLM_FAMILIES:
        raise ConfigError(f"HF model_type {family!r} is not a supported vision-language family; supported: "
                          f"{', '.join(VLM_FAMILIES)}")
    return VLM_FAMILIES[str(family)]


def vlm_arch(path_or_dict: str | Path | Mapping[str, Any], make_vocab_size_divisible_by: int = 128,
             seq_length: int | None = None) -> ModelArch:
    """ModelArch of the language model (1-D RoPE fields; M-RoPE's sections come from mrope_section)."""
    return arch_from_hf_config(text_config_of(load_hf_config(path_or_dict)), make_vocab_size_divisible_by, seq_length)


def mrope_section(hf_config: Mapping[str, Any]) -> list[int]:
    """M-RoPE's (temporal, height, width) split of the rotary frequencies; they cover head_dim / 2."""
    text = text_config_of(hf_config)
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = params.get("mrope_section")
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"]))
    if not section or sum(section) * 2 != head_dim:
        raise ConfigError(f"{hf_config.get('model_type')} config: text_config rope mrope_section={section!r} must "
                          f"sum to head_dim / 2 = {head_dim // 2}")
    return [int(s) for s in section]


def build_vision_tower(hf_config: Mapping[str, Any], dtype: torch.dtype) -> torch.nn.Module:
    """transformers' own vision tower of the family, randomly initialised (load_vlm_weights fills it)."""
    vision = hf_config.get("vision_config")
    if not isinstance(vision, Mapping):
        raise ConfigError(f"{hf_config.get('model_type')} config: no vision_config section")
    return vlm_family(hf_config).vision_tower(dict(vision)).to(dtype)


def image_token_id(hf_config: Mapping[str, Any]) -> int:
    value = hf_config.get("image_token_id")
    if value is None:
        raise ConfigError(f"{hf_config.get('model_type')} config: image_token_id is missing")
    return int(value)
