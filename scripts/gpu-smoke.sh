#!/usr/bin/env bash
# The GPU device check, in two parts (issue 39), one JSON line per step:
# (1) the trainer on CUDA, for a machine with torch and the wheels scripts/gpu-wheels.sh carries (no SGLang,
#     no Ray): lean_rl/testing/gpu_smoke_trainer.py, under 7 minutes (killed at 420 s)
#   bash scripts/gpu-smoke.sh --trainer-only                 # on the GPU
#   bash scripts/gpu-smoke.sh --trainer-only --device cpu    # the same steps on CPU (CI does)
# (2) the engine side, for a full GPU environment (SGLang's GPU build, Ray: scripts/setup.sh):
#     lean_rl/testing/gpu_smoke.py, what a user runs first
#   bash scripts/gpu-smoke.sh [--steps env,engine,memory,disk,lora,corrupt,loop]
# PYTHON=python3 uses that interpreter instead of .venv's (a device machine with carried wheels).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
if [[ ${1:-} == --trainer-only ]]; then
  shift
  exec timeout --kill-after=15 420 "$PY" -m lean_rl.testing.gpu_smoke_trainer "$@"
fi
exec "$PY" -m lean_rl.testing.gpu_smoke "$@"
