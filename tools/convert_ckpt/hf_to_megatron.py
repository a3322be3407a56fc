"""HF safetensors -> Megatron torch_dist (model only). Same as `python -m lean_rl.convert hf-to-megatron`;
see `--help`."""

import sys

from lean_rl.convert.cli import run

if __name__ == "__main__":
    sys.exit(run("hf-to-megatron", sys.argv[1:]))
