#!/usr/bin/env bash
# Set up the environment (idempotent) and run the default test suite: unit, integration (real SGLang
# servers, router, Megatron over gloo, Ray) and e2e, without the tests marked slow.
#   bash scripts/test.sh                 # default run
#   bash scripts/test.sh -m slow         # only the slow ones; any pytest arguments pass through
#   bash scripts/test.sh --slow-tiers [GROUP...]  # the slow ones by group (integration, e2e, examples), each
#                                        # with its pass count and minutes (tests/slow_tiers.py)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
if [[ "${1:-}" == "--slow-tiers" ]]; then
  shift
  exec .venv/bin/python tests/slow_tiers.py "$@"
fi
exec .venv/bin/python -m pytest --timeout=900 --durations=25 "$@"
