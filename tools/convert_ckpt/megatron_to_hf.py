"""Megatron torch_dist -> HF safetensors. Same as `python -m lean_rl.convert megatron-to-hf`; see `--help`."""

import sys

from lean_rl.convert.cli import run

if __name__ == "__main__":
    sys.exit(run("megatron-to-hf", sys.argv[1:]))
