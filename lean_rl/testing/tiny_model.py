"""Build small random-weight HF checkpoints (and a locally trained tokenizer) with no hub access.

    python -m lean_rl.testing.tiny_model --out DIR [--arch ARCH] [--seed N] [--preset tiny]
    (ARCH: one of SUPPORTED_ARCHS)

Tests, the demo and the benchmarks all start from these. The tokenizer is the same for every arch and
seed (trained on a fixed synthetic corpus), so checkpoints of different archs are interchangeable on the
data side; `--seed` only changes the weights. Same arguments -> byte-identical safetensors.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHS = ("qwen2", "llama", "qwen3", "qwen3_moe", "mistral", "glm4", "deepseek_v3", "mixtral", "glm4_moe")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

# Qwen-style chat template: enough for --apply-chat-template and SGLang's /v1/chat/completions.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int  # target BPE size; the trained tokenizer may come out a little smaller
    num_experts: int = 4
    moe_intermediate_size: int = 128
    experts_per_token: int = 2


PRESETS = {
    # ~100k parameters: every test, the demo's parity check.
    "tiny": Preset(hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=512),
    # ~1M parameters: the CPU GRPO job, where the policy must be able to learn something.
    "small": Preset(hidden_size=128, intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2, vocab_size=512),
    # ~100M parameters: benchmarks of weight sync and conversion.
    "base100m": Preset(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=4,
                       vocab_size=8192, num_experts=8, moe_intermediate_size=512),
    # ~0.5B parameters (1.9 GB in float32): the large end of the bench's cost curves (bench/curves.py, not --quick).
    "base500m": Preset(hidden_size=1536, intermediate_size=4096, num_layers=18, num_heads=12, num_kv_heads=4,
                       vocab_size=8192, num_experts=8, moe_intermediate_size=512),
}

_WORDS = (
    "the a cat dog sat on mat ran fast slow big small red blue green hello world user assistant system "
    "question answer yes no why how what is are was were will can model token server test add sum "
    "equals plus minus times number result count letter word repeat reverse copy answer final"
).split()


def _corpus(n_lines: int) -> list[str]:
    rng = random.Random(0)  # fixed: one tokenizer for every model seed
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 15))]
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ""]))
    lines += [f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)]
    lines += [" ".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(500)]
    lines += ["\\boxed{" + str(i) + "}" for i in range(100)]
    return lines


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(3000), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_config(arch: str, preset: Preset, tokenizer):
    import transformers

    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"--arch {arch!r} is not supported; choose one of {', '.join(SUPPORTED_ARCHS)}")
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters=rope,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    head_dim = preset.hidden_size // preset.num_heads
    # One entry per family: its own transformers config class and what it sets beyond `common`.
    families: dict[str, tuple[Any, dict[str, Any]]] = {
        "qwen2": (transformers.Qwen2Config, dict(use_sliding_window=False)),
        "llama": (transformers.LlamaConfig, dict(attention_bias=False, mlp_bias=False)),
        "qwen3": (transformers.Qwen3Config, dict(head_dim=head_dim, attention_bias=False, use_sliding_window=False)),
        "qwen3_moe": (transformers.Qwen3MoeConfig, dict(
            head_dim=head_dim, attention_bias=False, num_experts=preset.num_experts,
            num_experts_per_tok=preset.experts_per_token, moe_intermediate_size=preset.moe_intermediate_size,
            decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, output_router_logits=False)),
        "mistral": (transformers.MistralConfig, dict(head_dim=head_dim, sliding_window=None)),
        # q/k/v biases, half-rotary interleaved RoPE, sandwich norms, fused gate_up
        "glm4": (transformers.Glm4Config, dict(
            head_dim=head_dim, attention_bias=True,
            rope_parameters={**rope, "partial_rotary_factor": 0.5})),
        # MLA with low-rank q, YaRN, one dense layer then MoE layers with a shared expert, sigmoid
        # router with expert bias, group-limited routing (2 groups, 1 chosen, top-2) and a scaling factor
        "deepseek_v3": (transformers.DeepseekV3Config, dict(
            num_key_value_heads=preset.num_heads, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=preset.num_experts,
            num_experts_per_tok=preset.experts_per_token, moe_intermediate_size=preset.moe_intermediate_size,
            n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, norm_topk_prob=True,
            routed_scaling_factor=2.5, rope_interleave=True, attention_bias=False,
            # as the published configs have them (SGLang's deepseek_v2.py reads them)
            moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid",
            rope_parameters={**rope, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                             "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
        # experts as wide as intermediate_size (Mixtral has no separate moe_intermediate_size)
        "mixtral": (transformers.MixtralConfig, dict(
            head_dim=head_dim, sliding_window=None, num_local_experts=preset.num_experts,
            num_experts_per_tok=preset.experts_per_token, intermediate_size=preset.moe_intermediate_size,
            router_jitter_noise=0.0, output_router_logits=False)),
        # GLM-4.5: q/k/v biases, qk norm, half-rotary RoPE (not interleaved), one dense layer then MoE
        # layers with a shared expert, sigmoid router with expert bias, renormalised and scaled top-k
        "glm4_moe": (transformers.Glm4MoeConfig, dict(
            head_dim=head_dim, attention_bias=True, use_qk_norm=True,
            rope_parameters={**rope, "partial_rotary_factor": 0.5}, n_routed_experts=preset.num_experts,
            num_experts_per_tok=preset.experts_per_token, moe_intermediate_size=preset.moe_intermediate_size,
            n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
            routed_scaling_factor=2.5, num_nextn_predict_layers=0)),
    }
    config_class, own = families[arch]
    return config_class(**{**common, **own})


def _randomize_(model, seed: int) -> None:
    """Non-trivial values everywhere: HF init leaves norms at 1 and biases at 0, which would hide
    mapping bugs (a swapped norm or a dropped bias changes nothing), and a 0.02-std lm_head makes the
    output distribution nearly flat, which makes log-prob comparisons meaningless."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.startswith("lm_head"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.08 * noise)
        for name, b in model.named_buffers():  # DeepSeek-V3's router bias is a checkpoint buffer
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen, dtype=b.dtype))


def make_tiny_model(out: str | Path, arch: str = "qwen2", seed: int = 0, preset: str = "tiny") -> Path:
    """Write an HF checkpoint (config, safetensors, tokenizer, chat template) to `out` and return it."""
    import torch
    import transformers

    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(PRESETS[preset].vocab_size)
    config = build_config(arch, PRESETS[preset], tokenizer)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    gen_cfg = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    gen_cfg.save_pretrained(out)
    (out / "lean_rl_tiny_model.json").write_text(json.dumps({"arch": arch, "seed": seed, "preset": preset}) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lean_rl.testing.tiny_model", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--arch", default="qwen2", choices=SUPPORTED_ARCHS)
    parser.add_argument("--seed", type=int, default=0, help="weight seed; the tokenizer does not depend on it")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    args = parser.parse_args(argv)
    path = make_tiny_model(args.out, args.arch, args.seed, args.preset)
    n_params = sum(
        int(v.numel()) for v in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
            str(path / "model.safetensors")).values()
    )
    print(f"wrote {args.arch} ({args.preset}, seed {args.seed}, {n_params:,} parameters) to {path}")


if __name__ == "__main__":
    main()
