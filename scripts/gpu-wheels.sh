#!/usr/bin/env bash
# The wheels part (1) of the device check carries (bash scripts/gpu-smoke.sh --trainer-only, issue 39): the
# packages lean_rl's in-process trainer imports beyond torch and torch's own dependencies, at
# requirements.txt's pins, for the device machine (Python 3.12, Linux x86_64; torch 2.11 is there already).
# Downloads them into .gpu-wheels/ (gitignored) and prints their total size (the device takes <= 64 MiB).
# What is needed was measured: the smoke passes with ray, sglang, transformers, einops, tensorboard,
# yaml, tqdm, absl and google made unimportable; psutil is imported by rank_actors.py.
#   bash scripts/gpu-wheels.sh            # then on the device: pip install --no-deps .gpu-wheels/*.whl
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
dest=${GPU_WHEELS_DIR:-.gpu-wheels}
pins=()
for name in megatron-core numpy packaging safetensors psutil; do
  pin=$(grep -i "^${name}==" requirements.txt) || { echo "gpu-wheels.sh: no pin for $name in requirements.txt" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p "$dest"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform any -d "$dest" "${pins[@]}" \
  2> >(grep -v "^WARNING: Location 'file://" >&2)  # the machine's pip config lists local mirrors that lack them
ls -l "$dest"/*.whl | awk '{printf "%10d  %s\n", $5, $9; total += $5} END {printf "total %.1f MiB in %d wheels\n", total / 1048576, NR}'
