"""The vision-language actor's pure pieces: image inputs of a micro-batch, M-RoPE positions (through
transformers' own rule), and the qwen2_5_vl family's config mapping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lean_rl.backends.megatron.vlm_batch import mrope_position_ids, stack_image_inputs
from lean_rl.backends.megatron.vlm_family import mrope_section, text_config_of, vlm_arch
from lean_rl.options import ConfigError

PAD = 514
CONFIG = {
    "model_type": "qwen2_5_vl", "image_token_id": PAD, "tie_word_embeddings": False,
    "text_config": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 516, "max_position_embeddings": 4096,
                    "rms_norm_eps": 1e-6, "hidden_act": "silu", "use_sliding_window": False,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    "vision_config": {"depth": 2, "hidden_size": 32, "spatial_merge_size": 2, "patch_size": 14,
                      "temporal_patch_size": 2, "out_hidden_size": 64},
}


def _image(grid=(1, 4, 6), dim=1176, value=0.0):
    n = int(np.prod(grid))
    return {"pixel_values": np.full((n, dim), value, np.float32), "image_grid_thw": np.array([grid], np.int64)}


def test_positions_of_text_image_text():
    # 3 text tokens, one 4x6-patch image (2x3 tokens after the 2x2 merge), 2 text tokens
    row = torch.tensor([[1, 2, 3] + [PAD] * 6 + [4, 5]])
    pos = mrope_position_ids(row, torch.tensor([[1, 4, 6]]), CONFIG)
    assert pos.shape == (3, 1, 11)
    assert pos[:, 0, :3].tolist() == [[0, 1, 2]] * 3
    assert pos[0, 0, 3:9].tolist() == [3] * 6  # temporal: one frame
    assert pos[1, 0, 3:9].tolist() == [3, 3, 3, 4, 4, 4]  # height rows
    assert pos[2, 0, 3:9].tolist() == [3, 4, 5, 3, 4, 5]  # width columns
    assert pos[:, 0, 9:].tolist() == [[6, 7]] * 3  # text resumes after the image's largest extent


def test_text_only_positions_are_plain_rope():
    row = torch.arange(7).unsqueeze(0)
    assert mrope_position_ids(row, None, CONFIG).tolist() == [[list(range(7))]] * 3


def test_stack_keeps_row_order_and_skips_text_rows():
    tokens = torch.tensor([[PAD] * 6 + [1], [1] * 7, [PAD] * 4 + [1, 1, 1]])
    out = stack_image_inputs([_image(value=1.0), None, _image((1, 4, 4), value=2.0)], tokens, PAD, 2)
    assert out is not None and out.images_per_row == (1, 0, 1)
    assert out.image_grid_thw.tolist() == [[1, 4, 6], [1, 4, 4]]
    assert out.pixel_values.shape == (24 + 16, 1176) and out.pixel_values[24:].eq(2.0).all()
    assert stack_image_inputs([None, None], torch.ones((2, 3), dtype=torch.long), PAD, 2) is None


@pytest.mark.parametrize("rows, tokens, message", [
    ([_image()], [[PAD] * 5 + [1]], "row 0: image_grid_thw [[1, 4, 6]] makes 6 image tokens, the row's tokens hold 5"),
    ([None], [[PAD, 1]], "row 0: none, but its tokens hold 1 image pads"),
    ([{"image_grid_thw": np.array([[1, 4, 6]])}], [[PAD] * 6], "row 0: missing pixel_values"),
    ([{**_image(), "pixel_values": np.zeros((23, 1176), np.float32)}], [[PAD] * 6], "does not hold the 24 patches"),
])
def test_bad_image_inputs_name_the_row(rows, tokens, message):
    with pytest.raises(ValueError, match="multimodal_train_inputs of row 0") as error:
        stack_image_inputs(rows, torch.tensor(tokens), PAD, 2)
    assert message in str(error.value)


def test_family_maps_the_language_model_to_qwen2():
    text = text_config_of(CONFIG)
    assert text["model_type"] == "qwen2" and text["tie_word_embeddings"] is False
    arch = vlm_arch(CONFIG, 96)
    assert (arch.num_layers, arch.hidden_size, arch.kv_channels, arch.add_qkv_bias) == (2, 64, 16, True)
    assert mrope_section(CONFIG) == [2, 3, 3]


def test_family_errors_are_one_line():
    with pytest.raises(ConfigError, match="mrope_section=\\[2, 2, 2\\] must sum to head_dim / 2 = 8"):
        bad = {**CONFIG, "text_config": {**CONFIG["text_config"],
                                         "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 2]}}}
        mrope_section(bad)
    with pytest.raises(ConfigError, match="'llava' is not a supported vision-language family; supported: qwen2_5_vl"):
        text_config_of({**CONFIG, "model_type": "llava"})


def test_a_vlm_checkpoint_resolves_to_its_language_model_and_its_own_family():
    from lean_rl.backends.megatron.hf_config import arch_from_hf_config, hf_family
    from lean_rl.backends.megatron.vlm_family import vlm_config_or_none

    assert arch_from_hf_config(CONFIG) == vlm_arch(CONFIG)  # what parse_config reads for --hf-checkpoint
    assert hf_family(CONFIG) == "qwen2_5_vl"  # the ranks' weight table: vlm_weights.py
    assert vlm_config_or_none(CONFIG) == CONFIG and vlm_config_or_none(text_config_of(CONFIG)) is None


def test_micro_batches_carry_their_rows_images_in_row_order():
    from lean_rl.backends.megatron.train_batches import Sequence, build_micro_batch, pad_micro_batch

    first, second = _image(value=1.0), _image(grid=(1, 2, 2), value=2.0)
    sequences = [Sequence(tokens=(1,) + (PAD,) * 6 + (2, 3), prompt_length=8, images=first),
                 Sequence(tokens=(4, 5, 6), prompt_length=2),
                 Sequence(tokens=(1, PAD, 7, 8), prompt_length=3, images=second)]
    batch = build_micro_batch([2, 1, 0], sequences, {})
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 6]]  # row 0 is sequence 2
    assert batch["pixel_values"][:4].eq(2.0).all() and batch["pixel_values"][4:].eq(1.0).all()
    padded = pad_micro_batch(batch, 4, 12)  # per image, not per token: unchanged
    assert padded["tokens"].shape == (4, 12) and padded["pixel_values"] is batch["pixel_values"]
    assert "pixel_values" not in build_micro_batch([1], sequences, {})


def test_a_text_model_refuses_a_micro_batch_with_images():
    from lean_rl.backends.megatron.vlm_batch import micro_batch_images, set_micro_batch_images

    images = micro_batch_images([_image()])
    with pytest.raises(ValueError, match="text model"):
        set_micro_batch_images(torch.nn.Linear(2, 2), images)
    set_micro_batch_images(torch.nn.Linear(2, 2), {})  # no images, no VLM: nothing to do
    with pytest.raises(ValueError, match="row 0: missing image_grid_thw"):
        micro_batch_images([{"pixel_values": np.zeros((4, 8), np.float32)}])
