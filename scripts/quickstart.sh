#!/usr/bin/env bash
# The main job on a fresh machine: set up the environment, then a tiny GRPO run on CPU
# (scripts/run-tiny-cpu.sh: real SGLang + router generate, real Megatron-core trains, weights synced
# and probed every step); the mean reward climbs from ~0.1 to ~1.0 in about two minutes.
#   bash scripts/quickstart.sh [extra flags for lean_rl.train]
# The engine/trainer parity check on its own: .venv/bin/python -m lean_rl.parity --hf-checkpoint DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec bash scripts/run-tiny-cpu.sh "$@"
