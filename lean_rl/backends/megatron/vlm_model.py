"""The vision-language actor (issue 44): Megatron's GPTModel as the language model (TP / PP as for text,
M-RoPE positions [3, b, s] through megatron-core's MultimodalRotaryEmbedding) and transformers' own vision
tower (Qwen2_5_VisionTransformerPretrainedModel), replicated on every rank of the first pipeline stage.

Why the HF tower and not a Megatron one: megatron-core 0.16.1 has no Qwen2.5-VL vision encoder (window
attention, 2-D rotary, the 2x2 patch merger); its CLIP/RADIO towers compute something else. The HF tower is
the engines' own definition, so it converts and syncs under the checkpoint's names unchanged
(`visual.*`), trains as any torch module, and is small next to the LM (0.7B of 7B in Qwen2.5-VL-7B), so
replicating it costs little. slime's geo3k_vlm example makes the same choice.

Images arrive per micro-batch through `set_images` (called by the forward step, as routing replay sets
its routes), so the module keeps GPTModel's call signature for Megatron's pipeline schedules."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from lean_rl.backends.megatron.config import MegatronConfig
from lean_rl.backends.megatron.model import build_gpt_model
from lean_rl.backends.megatron.vlm_batch import ImageInputs, mrope_position_ids
from lean_rl.backends.megatron.vlm_family import (LANGUAGE_PREFIX, VISION_PREFIX, build_vision_tower, image_token_id,
                                                  mrope_section)


class VisionLanguageModel(torch.nn.Module):
    def __init__(self, language_model: GPTModel, vision_model: torch.nn.Module | None, hf_config: Mapping[str, Any],
                 freeze_vision_tower: bool = False):
        super().__init__()
        self.language_model = language_model
        self.vision_model = vision_model  # None on later pipeline stages
        self.hf_config = dict(hf_config)
        self.image_token_id = image_token_id(hf_config)
        self.config = language_model.config  # Megatron's schedules read model.config and model.model_type
        self.model_type = language_model.model_type
        self.pre_process, self.post_process = language_model.pre_process, language_model.post_process
        self._images: ImageInputs | None = None
        if vision_model is not None and freeze_vision_tower:
            vision_model.requires_grad_(False)

    def set_images(self, images: ImageInputs | None) -> None:
        """The next forward's images (the micro-batch's rows' images, in row order), or None; that
        forward consumes them."""
        self._images = images

    def set_input_tensor(self, input_tensor) -> None:  # pipeline stages after the first
        self.language_model.set_input_tensor(input_tensor)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """Megatron's dist-checkpoint view. The LM's stored keys are GPTModel's own (those of a text
        checkpoint: the loader's vocab-padding and alias rules, model_checkpoint.py, apply unchanged), under
        state-dict names prefixed language_model.; the tower's tensors are replicated (Megatron's default for
        plain torch modules) under vision_model."""
        from megatron.core.transformer.utils import sharded_state_dict_default

        language = self.language_model.sharded_state_dict(prefix=prefix, sharded_offsets=sharded_offsets,
                                                          metadata=metadata)
        state = {LANGUAGE_PREFIX + name: item for name, item in language.items()}
        if self.vision_model is not None:
            # tp_group named: with a dp group in `metadata` and no tp_group, megatron-core 0.16.1
            # (transformer/utils.py:111) leaves the TP group unset and every TP rank claims replica 0
            tp_group = parallel_state.get_tensor_model_parallel_group()
            state.update(sharded_state_dict_default(self.vision_model, prefix + VISION_PREFIX, sharded_offsets,
                                                    metadata, tp_group=tp_group))
        return state

    def image_embeddings(self, images: ImageInputs) -> torch.Tensor:
        """[n_image_tokens, hidden]: the tower's merged patch embeddings, images one after another."""
        if self.vision_model is None:
            raise RuntimeError("image embeddings asked of a pipeline stage without the vision tower")
        dtype = next(self.vision_model.parameters()).dtype
        out = self.vision_model(images.pixel_values.to(device=self._device(), dtype=dtype),
                                grid_thw=images.image_grid_thw.to(self._device()))
        return out.pooler_output

    def _device(self) -> torch.device:
        return next(self.language_model.parameters()).device

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs):
        """GPTModel's forward with the images of set_images in place of the image pads; `position_ids`
        (1-D) are replaced by the rows' M-RoPE positions."""
        # consumed: a later forward without set_images (the weight-sync probe, scoring) is text-only
        images, self._images = self._images, None
        grids = images.image_grid_thw if images is not None else None
        positions = mrope_position_ids(input_ids.cpu(), grids, self.hf_config).to(input_ids.device)
        decoder_input = None
        if self.language_model.pre_process:
            decoder_input = self.language_model.embedding(input_ids=input_ids, position_ids=None)  # [s, b, h]
            if images is not None:
                mask = (input_ids == self.image_token_id).transpose(0, 1).unsqueeze(-1)  # [s, b, 1]
                # [s, b] order is position-major; the embeddings come row by row: scatter in [b, s] order
                embeds = self.image_embeddings(images).to(decoder_input.dtype)
                if int(mask.sum()) != embeds.shape[0]:
                    raise ValueError(f"{int(mask.sum())} image pads in the micro-batch, the images make "
                                     f"{embeds.shape[0]} embeddings")
                by_row = decoder_input.transpose(0, 1).masked_scatter(mask.transpose(0, 1), embeds)
                decoder_input = by_row.transpose(0, 1).contiguous()
        return self.language_model(input_ids, positions, attention_mask, decoder_input=decoder_input, **kwargs)


def build_vlm_model(config: MegatronConfig, hf_config: Mapping[str, Any], device: torch.device,
                    freeze_vision_tower: bool = False) -> VisionLanguageModel:
    """This rank's stage of the VLM (after distributed.init_distributed), on `device`, in eval mode;
    random weights until load_vlm_weights."""
    if config.parallel.sequence_parallel:
        # the image embeddings are scattered into the full [s, b, h] input; SP would split s first
        raise ValueError("--sequence-parallel is not supported with a vision-language model yet")
    language = build_gpt_model(config, device, mrope_section=mrope_section(hf_config))
    vision = None
    if parallel_state.is_pipeline_first_stage():
        vision = build_vision_tower(hf_config, getattr(torch, config.params_dtype)).to(device)
    return VisionLanguageModel(language, vision, hf_config, freeze_vision_tower).eval()
