"""SGLang serving multi-latent attention (DeepSeek-V3, Kimi-K2, Moonlight) on CPU with the torch_native
attention backend. SGLang 0.5.23's DeepSeek model asks a per-backend handler which attention path to
take (sglang/srt/models/deepseek_common/attention_backend_handler.py:54 get_handler); torch_native has
none registered, so it gets triton's (:233), which picks the MHA path for a prefill without cached
prefix (:247-251). That path runs attention over the KV pool's buffers
(layers/attention/torch_native_backend.py:312), but an MLA model's pool holds the compressed latent
([kv_lora_rank + rope] per token), so the SDPA fails on its value shape
(torch_native_backend.py:160: "Expected size ... [4, 24] but got: [4, 40]"). The absorbed MLA path
(AttnForwardMethod.MLA: attention over the latent, as MQA) is what that pool holds, and torch_native
computes it: registered here for torch_native, always (prefill and decode). Measured: the tiny
deepseek_v3 checkpoint served on CPU, float32, max |log p - transformers| 7.6e-6."""

from __future__ import annotations


def serve_mla_on_torch_native() -> None:
    """Register the absorbed-MLA choice as SGLang's torch_native handler for DeepSeek-style models."""
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    handlers.AttentionBackendRegistry.register("torch_native", _absorbed_mla)


def _absorbed_mla(attn, forward_batch):
    from sglang.srt.models.deepseek_common import attention_backend_handler as handlers

    return handlers._dispatch_mla_subtype(attn, forward_batch)  # MLA (MLA_FUSED_ROPE_CPU needs intel_amx)
