"""The LoRA adapter the engines serve beside their frozen base (--lora-sync adapter).

SGLang's own multi-LoRA support (sglang/srt/lora/): a server started with --enable-lora holds the
base weights untouched and applies an adapter per request, the one the request names in `lora_path`.
A weight sync then moves only the adapter's tensors (/load_lora_adapter_from_tensors after
/unload_lora_adapter: weight_sync/transports/adapter.py), and every request of the run names the
adapter (EngineClient.adapter), so no request is served by the bare base and labelled current.

    adapter = ServedAdapter(rank=8, alpha=16.0, target_modules=("q_proj", "k_proj", ...))
    flags = adapter.server_flags("cpu")     # for server_command.server_flags
    body = adapter.peft_config()            # config_dict of /load_lora_adapter_from_tensors

On CPU the adapters run on SGLang's torch_native LoRA backend (the Triton ones need a GPU), after
compat.serve_lora_without_pinned_memory. On GPU SGLang picks its default backend.
"""

from __future__ import annotations

from dataclasses import dataclass

ADAPTER_NAME = "policy"  # what requests name (lora_path); one adapter per run


@dataclass(frozen=True)
class ServedAdapter:
    rank: int
    alpha: float  # the update is alpha / rank * B A, as PEFT's lora_alpha
    target_modules: tuple[str, ...]  # HF module names (q_proj, ..., down_proj)
    name: str = ADAPTER_NAME
    max_loaded: int = 1  # adapters held at once (lean_rl.serve_tinker: one per training client and snapshot)

    def server_flags(self, device: str) -> dict[str, list[str]]:
        flags = {"--enable-lora": [], "--max-lora-rank": [str(self.rank)],
                 "--lora-target-modules": list(self.target_modules),
                 # a run: one adapter at a time, the old version unloaded before the new one loads
                 "--max-loaded-loras": [str(self.max_loaded)], "--max-loras-per-batch": [str(self.max_loaded)]}
        if device == "cpu":
            flags["--lora-backend"] = ["torch_native"]
        return flags

    def peft_config(self) -> dict:
        """The adapter_config.json PEFT would write for it (SGLang's LoRAConfig.from_dict reads this)."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                "target_modules": list(self.target_modules), "bias": "none", "lora_dropout": 0.0}

