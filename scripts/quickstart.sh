#!/usr/bin/env bash
# The main job on a fresh machine: set up the environment, build the tiny model, and run the engine /
# trainer parity check (SGLang serving vs Megatron at TP1, TP2, PP2). As the project grows this
# becomes the tiny GRPO run (scripts/run-tiny-cpu.sh).
#   bash scripts/quickstart.sh [extra flags for python -m lean_rl.parity]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
out=${LEAN_RL_OUT:-outputs/quickstart}
mkdir -p "$out"
.venv/bin/python -m lean_rl.testing.tiny_model --out "$out/tiny-qwen2" --arch qwen2 --seed 0
exec .venv/bin/python -m lean_rl.parity --hf-checkpoint "$out/tiny-qwen2" --run-dir "$out/run" \
  --json "$out/parity.json" "$@"
