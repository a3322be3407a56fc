#!/usr/bin/env bash
# Set up the environment (idempotent) and run the default test suite: unit, integration (real SGLang
# servers, router, Megatron over gloo, Ray) and e2e, without the tests marked slow.
#   bash scripts/test.sh                 # default run
#   bash scripts/test.sh -m slow         # only the slow ones; any pytest arguments pass through
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest --timeout=900 --durations=25 "$@"
