"""LoRA on the actor: its flags, declared once on their fields (lean_rl/options.py; the group "lora" of
TrainConfig), and what they may be combined with. Importing this does not import Megatron."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.options import ConfigError, flag_of, option


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


# Megatron's names of the linear layers of a transformer layer (those Megatron-Bridge / NeMo adapt).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")

# The HF modules whose weights each target makes up, the same in every supported family (a unit test
# holds this in step with hf_weights/families.py): what engines serving the adapter apart adapt.
LORA_HF_MODULES = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                   "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


@dataclass(frozen=True)
class LoraConfig:
    """LoRA on the actor (backends/megatron/lora.py): the base weights are frozen and each targeted
    linear layer learns W + alpha / rank * B A; the engines get the adapters (or that merged weight:
    --lora-sync, weight_sync/config.py)."""

    lora_rank: int = option(0, help="train LoRA adapters of this rank on the actor's linear layers instead of all "
                                    "weights (the engines get the adapters, or W + alpha/rank B A: --lora-sync); "
                                    "0: full fine-tuning")
    lora_alpha: float | None = option(None, help="the adapters' update is alpha / rank * B A; default 2 x --lora-rank")
    lora_dropout: float = option(0.0, help="dropout on the adapters' input while training")
    lora_target_modules: tuple[str, ...] = option(
        (), metavar="NAME", help=f"Megatron linear layers to adapt, space or comma separated: {' '.join(LORA_TARGETS)} "
                                 "(default: all of them; MoE layers: their attention only)")

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        """--lora-target-modules as names: "a,b c" and "a b c" are the same list (options.build)."""
        items = values["lora_target_modules"]
        return {**values, "lora_target_modules": tuple(n for item in items for n in item.replace(",", " ").split())}

    def __post_init__(self) -> None:
        names = self.lora_target_modules
        _require(isinstance(self.lora_rank, int) and self.lora_rank >= 0,
                 f"--lora-rank must be an integer >= 0, got {self.lora_rank!r}")
        unknown = [n for n in names if n not in LORA_TARGETS]
        _require(not unknown, f"--lora-target-modules {' '.join(unknown)}: choose from {' '.join(LORA_TARGETS)}")
        _require(self.lora_alpha is None or self.lora_alpha > 0, f"--lora-alpha must be > 0, got {self.lora_alpha}")
        _require(0 <= self.lora_dropout < 1, f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if not self.enabled:
            given = [flag_of(LoraConfig, name) for name in ("lora_alpha", "lora_dropout", "lora_target_modules")
                     if getattr(self, name) != LoraConfig.__dataclass_fields__[name].default]
            _require(not given, f"{' and '.join(given)} {'has' if len(given) == 1 else 'have'} no effect "
                                    "without --lora-rank > 0")

    @property
    def enabled(self) -> bool:
        return self.lora_rank > 0

    @property
    def alpha(self) -> float:
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    @property
    def scaling(self) -> float:
        return self.alpha / self.lora_rank

    @property
    def hf_modules(self) -> tuple[str, ...]:
        """The HF modules the adapters of a dense model cover."""
        return tuple(module for target in self.lora_target_modules or LORA_TARGETS for module in LORA_HF_MODULES[target])

    def check_parallel(self, parallel: ParallelConfig) -> None:
        """Under TP the adapters split as their layers do (lora.LoraAdapter); their input must be whole
        on every TP rank of a column-parallel layer, and dropped out alike there."""
        if not self.enabled or parallel.tensor_model_parallel_size == 1:
            return
        _require(not parallel.sequence_parallel,
                 "--lora-rank with --tensor-model-parallel-size > 1 cannot take --sequence-parallel (the adapters "
                 "read the layer's input before Megatron gathers its sequence shards)")
        _require(self.lora_dropout == 0,
                 "--lora-dropout > 0 with --tensor-model-parallel-size > 1: each TP rank would drop different "
                 "inputs of the adapter A they share; use --lora-dropout 0 or TP 1")

    def check_layer_spec(self, transformer_impl: str, device: str) -> None:
        """The adapters sit on Megatron's local linear layers: on a GPU with TransformerEngine installed
        the default spec would be TE's (review C3), so LoRA needs the local one asked for there."""
        import importlib.util

        _require(not self.enabled or transformer_impl == "local" or device != "cuda"
                 or importlib.util.find_spec("transformer_engine") is None,
                 "--lora-rank adapts Megatron's local layers; with TransformerEngine installed on a GPU add "
                 "--transformer-impl local")
