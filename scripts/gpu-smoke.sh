#!/usr/bin/env bash
# The GPU smoke check (lean_rl/testing/gpu_smoke.py): the CUDA paths no CPU run takes, one JSON line per
# step, under 8 minutes on one GPU. Steps whose packages are missing say so and are skipped.
#   bash scripts/gpu-smoke.sh                              # every step, on the GPU
#   bash scripts/gpu-smoke.sh --device cpu --steps env,trainer   # what runs on CPU (CI does)
# PYTHON=python3 uses that interpreter instead of .venv's (a device machine with carried wheels).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
exec "$PY" -m lean_rl.testing.gpu_smoke "$@"
