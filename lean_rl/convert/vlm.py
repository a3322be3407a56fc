"""HF <-> Megatron torch_dist for vision-language checkpoints (issue 44; vlm_family.VLM_FAMILIES).

Unlike the text converter (hf_to_megatron.py, which streams chunk by chunk), this one goes through the
model: one rank in this process builds VisionLanguageModel, loads the HF tensors through the same tables
the trainer uses and writes Megatron's own save of it (model_checkpoint.save_model_checkpoint), so the
keys are by construction the trainer's, the vision tower's included (`vision_model.*`, replicated).
The other way loads that save (any layout wrote it: torch_dist reshards) and gathers the HF tensors.
The whole model is held in memory once, in the checkpoint's dtype: fine for Qwen2.5-VL up to 7B on a
host; the streaming path for larger ones is not built. Output files appear only when complete."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from lean_rl.backends.megatron.checkpoint_paths import HF_CONFIG_DIR, find_checkpoint
from lean_rl.backends.megatron.hf_side_files import copy_side_files
from lean_rl.backends.megatron.hf_config import checkpoint_dtype, load_hf_config
from lean_rl.backends.megatron.model_checkpoint import load_model_checkpoint, save_model_checkpoint
from lean_rl.backends.megatron.vlm_family import vlm_family
from lean_rl.backends.megatron.vlm_local import run_vlm_rank
from lean_rl.backends.megatron.vlm_weights import gather_vlm_hf_state_dict
from lean_rl.convert.output_dir import atomic_output_dir
from lean_rl.convert.vlm_lora import add_stored_adapters

_DTYPES = ("float32", "bfloat16", "float16")


def _params_dtype(hf_dir: str | Path) -> str:
    name = checkpoint_dtype(hf_dir) or "float32"
    if name not in _DTYPES:
        raise ValueError(f"{hf_dir}/config.json: dtype {name!r} is not one of {', '.join(_DTYPES)}")
    return name


def convert_vlm_hf_to_megatron(hf_dir: str | Path, save: str | Path, *, make_vocab_size_divisible_by: int = 128,
                               iteration: int = 0) -> Path:
    """HF_DIR -> SAVE/iter_N (model only, with hf_config/); returns the iteration directory."""
    vlm_family(load_hf_config(hf_dir))  # one line naming the model_type if it is not a VLM family

    def job(model, config) -> Path:
        with atomic_output_dir(save) as root:
            written = save_model_checkpoint(model, root, iteration, hf_config_dir=hf_dir)
        return Path(save) / Path(written).name

    return run_vlm_rank(job, hf_dir, divisible_by=make_vocab_size_divisible_by, params_dtype=_params_dtype(hf_dir))


def convert_vlm_megatron_to_hf(load: str | Path, save: str | Path, *, iteration: int | None = None,
                               make_vocab_size_divisible_by: int = 128, hf_config: str | Path | None = None) -> Path:
    """A model-only or trainer checkpoint of a VLM -> HF_OUT (model.safetensors + the config, tokenizer and
    processor files of its hf_config/, or of `hf_config`: a trainer checkpoint has none). Returns HF_OUT."""
    _, directory = find_checkpoint(load, iteration)
    hf_dir = Path(hf_config) if hf_config is not None else directory / HF_CONFIG_DIR
    vlm_family(load_hf_config(hf_dir))

    def job(model, config) -> Path:
        add_stored_adapters(model, directory)  # a LoRA run's: the export merges them (vlm_lora.py)
        load_model_checkpoint(model, directory, vocab_size=config.arch.vocab_size)  # any vocab padding
        state = gather_vlm_hf_state_dict(model, config)
        assert state is not None  # one rank: rank 0
        with atomic_output_dir(save) as out:
            save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
                      metadata={"format": "pt"})
            copy_side_files(hf_dir, out)
        return Path(save)

    return run_vlm_rank(job, hf_dir, divisible_by=make_vocab_size_divisible_by, params_dtype=_params_dtype(hf_dir),
                        load_hf=False)
