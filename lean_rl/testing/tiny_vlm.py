"""A tiny random Qwen2.5-VL checkpoint (weights, processor, chat template) with no hub access.

    python -c 'from lean_rl.testing.tiny_vlm import make_tiny_vlm; make_tiny_vlm("DIR")'

What tools/vlm_spike.py showed SGLang 0.5.23 serves on CPU (docs/vlm_spike.md): text 2 layers x hidden 64
(head_dim 16, M-RoPE sections [2, 3, 3]), vision depth 2 x hidden 32, patch 14, merge 2; lean_rl's locally
trained tokenizer plus Qwen's vision special tokens; images of 56²..112² pixels (4..16 image tokens).
The chat template takes content parts ({"type": "image"} / {"type": "text"}) as Qwen's does.
"""

from __future__ import annotations

from pathlib import Path

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}" + IMAGE_PROMPT + "{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112


def build_processor(seed_tokenizer_size: int = 512):
    """The tiny VLM's processor: lean_rl's tokenizer with Qwen's vision tokens and an image processor of
    56²..112² pixels (no weights: unit tests render image prompts with it in seconds)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    from lean_rl.testing.tiny_model import build_tokenizer

    tok = build_tokenizer(seed_tokenizer_size)
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tok.chat_template = CHAT_TEMPLATE
    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2),
        video_processor=Qwen2VLVideoProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2),
        tokenizer=tok, chat_template=CHAT_TEMPLATE,
    )


def make_tiny_vlm(out: str | Path, seed: int = 0) -> Path:
    import torch
    import transformers
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from lean_rl.testing.tiny_model import _randomize_

    out = Path(out)
    processor = build_processor()
    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6, use_sliding_window=False,
        # head_dim 16: mrope sections (temporal, height, width) sum to head_dim / 2
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False, dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)  # float32: the config's dtype and torch's default
    _randomize_(model, seed)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    transformers.GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id).save_pretrained(out)
    return out
