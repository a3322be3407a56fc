#!/usr/bin/env bash
# One-command install: creates .venv (Python 3.11) and installs the pinned environment.
#   bash scripts/setup.sh            # CPU set, or the GPU set when `nvidia-smi -L` lists a GPU
# Idempotent: a second run with unchanged requirement files returns in about a second.
# PYTHON=/path/to/python3.11 picks the interpreter; LEAN_RL_VENV=DIR puts the venv elsewhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python_bin=${PYTHON:-python3.11}
venv=${LEAN_RL_VENV:-.venv}

if ! command -v "$python_bin" >/dev/null 2>&1; then
  echo "setup.sh: $python_bin not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "setup.sh: $python_bin is Python $("$python_bin" -c 'import sys; print(sys.version.split()[0])'), need 3.11" >&2
  exit 1
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  flavour=gpu
  req_files=(requirements-gpu.txt)
else
  flavour=cpu
  req_files=(requirements.txt requirements-nodeps.txt)
fi

stamp="$venv/.lean_rl-setup-stamp"
want=$(cat "${req_files[@]}" pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)-$flavour
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup.sh: $venv is up to date ($flavour)"
  exit 0
fi

quiet_pip() {  # the machine's pip config lists local mirrors that lack most packages: hide that noise
  "$venv/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2)
}

start=$(date +%s)
[[ -x "$venv/bin/python" ]] || "$python_bin" -m venv "$venv"
if [[ $flavour == gpu ]]; then
  quiet_pip install -q -r requirements-gpu.txt
else
  quiet_pip install -q -r requirements.txt
  quiet_pip install -q --no-deps -r requirements-nodeps.txt
fi
quiet_pip install -q --no-deps --no-build-isolation -e .
if [[ $flavour == cpu ]]; then
  # CUDA-linked torchvision beside CPU torch: see lean_rl/backends/sglang/torchvision_fix.py.
  # The one patch loaded implicitly (a .pth runs in every interpreter of this venv); every other fix
  # is a function its caller applies. Kept because `import torchvision` happens behind entry points
  # we do not own: `from transformers import AutoModelForCausalLM` (tests, fixtures, user scripts,
  # subprocesses) and SGLang's config imports, in the driver, Ray workers and spawned children alike;
  # an explicit import at each of our entry points would still miss those. CPU flavour only.
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import lean_rl.backends.sglang.torchvision_fix" > "$site/lean_rl_torchvision_fix.pth"
fi
PYTHONWARNINGS=ignore "$venv/bin/python" -c "import lean_rl, torch, megatron.core, sglang, ray, transformers" \
  || { echo "setup.sh: the installed environment does not import; see the error above" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup.sh: $flavour environment ready in $venv ($(( $(date +%s) - start )) s)"
