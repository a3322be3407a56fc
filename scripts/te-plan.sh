#!/usr/bin/env bash
# Whether scripts/setup.sh builds TransformerEngine on a GPU machine; prints one line, "build: WHY" or
# "skip: WHY", and exits 0; exits 1 with one line on stderr when the build was asked for and cannot run.
# TE is opt-in (LEAN_RL_TE=1): PyPI has no wheel for its torch part (transformer-engine-torch 2.20.2 is
# an sdist), whose setup.py fetches a prebuilt wheel from GitHub or compiles with nvcc (CUDA_HOME, or
# nvcc on PATH), 10-30 min (review 2026-12-06 N3). Without it Megatron-core builds its own layers
# (--transformer-impl local; lean_rl's default falls back to it by itself).
#   LEAN_RL_TE=1 bash scripts/te-plan.sh      # build: nvcc at /usr/local/cuda/bin/nvcc ...
set -euo pipefail
te=${LEAN_RL_TE:-0}
build="transformer-engine[pytorch]==2.20.2 (requirements-gpu-te.txt) built from source against the venv's torch with nvcc, 10-30 min"
local_note="training uses Megatron-core's own layers (--transformer-impl local)"
if [[ $te != 1 ]]; then
  echo "skip: TransformerEngine is opt-in (LEAN_RL_TE=1 builds $build); $local_note"
  exit 0
fi
nvcc_path=""
if [[ -n ${CUDA_HOME:-} && -x ${CUDA_HOME}/bin/nvcc ]]; then
  nvcc_path=${CUDA_HOME}/bin/nvcc
elif command -v nvcc >/dev/null 2>&1; then
  nvcc_path=$(command -v nvcc)
fi
if [[ -z $nvcc_path ]]; then
  echo "setup.sh: LEAN_RL_TE=1 asks for $build, but no nvcc was found (CUDA_HOME=${CUDA_HOME:-unset}, PATH):" \
       "install the CUDA toolkit or set CUDA_HOME, or run without LEAN_RL_TE ($local_note)" >&2
  exit 1
fi
echo "build: nvcc at $nvcc_path; $build"
