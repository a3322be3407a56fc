#!/usr/bin/env bash
# Installs tinker-cookbook at the versions of requirements-cookbook.txt into a folder of its own (default
# /opt/cookbook), without dependency resolution (why: requirements-cookbook.txt). Then:
#   PYTHONPATH=/opt/cookbook python examples/tinker_cookbook/run_recipes.py ...
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
target="${1:-/opt/cookbook}"
python="${PYTHON:-$here/.venv/bin/python}"
"$python" -m pip install --no-deps --target "$target" -r "$here/requirements-cookbook.txt"
"$python" -c "import sys; sys.path.insert(0, '$target'); import tinker_cookbook.preference.train_dpo, tinker_cookbook.recipes.rl_loop"
echo "tinker-cookbook installed in $target (put it on PYTHONPATH)"
