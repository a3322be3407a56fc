#!/usr/bin/env bash
# One-command install: creates .venv (Python 3.11) and installs the pinned environment.
#   bash scripts/setup.sh            # CPU set, or the GPU set when `nvidia-smi -L` lists a GPU
# Idempotent: a second run with unchanged requirement files returns in about a second
# (LEAN_RL_FORCE_SETUP=1 runs every step again, e.g. to repair a venv). Each step prints a line with
# the time since the start.
# PYTHON=/path/to/python3.11 picks the interpreter; LEAN_RL_VENV=DIR puts the venv elsewhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python_bin=${PYTHON:-python3.11}
venv=${LEAN_RL_VENV:-.venv}

# Tool code (lean_rl.rollout.sandbox) runs inside bubblewrap; a run whose hooks use the sandbox refuses to
# start without it. cgroup-tools puts each call in a cgroup that bounds its processes and memory together
# (without it calls run with rlimits only, and the run's start-up line says so). Checked on every setup run
# (also when the venv is up to date): they are outside the venv.
start=$(date +%s)
step() {  # one line per step, with the time since setup started
  echo "setup.sh [+$(( $(date +%s) - start ))s] $*"
}
system_package() {  # PACKAGE BINARY WHAT-IT-DOES WHAT-HAPPENS-WITHOUT-IT
  local package=$1 binary=$2 does=$3 without=$4
  if command -v "$binary" >/dev/null 2>&1; then
    step "$package is installed ($(command -v "$binary")): $does"
  elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    step "installing $package (apt-get install -y $package): $does"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null 2>&1 \
       || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null; }; then
      step "$package installed ($(command -v "$binary"))"
    else
      echo "setup.sh: WARNING: apt-get could not install $package; $without" >&2
    fi
  else
    echo "setup.sh: WARNING: $package ($binary) is not installed and setup cannot install it (needs root and apt-get):" \
         "ask for \`apt-get install $package\` (dnf/pacman: $package); until then $without" >&2
  fi
}
system_package bubblewrap bwrap "it isolates tool code" \
  "runs whose tools use lean_rl.rollout.sandbox refuse to start (or pass --tool-sandbox none: unisolated)"
if ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 '; then
  step "libseccomp2 is installed: it builds the tool sandbox's seccomp filter"
else  # no binary of its own to look for: system_package finds none and installs it
  system_package libseccomp2 libseccomp2-has-no-binary "it builds the tool sandbox's seccomp filter" \
    "runs whose tools use lean_rl.rollout.sandbox refuse to start (or pass --tool-sandbox none: unisolated)"
fi
system_package cgroup-tools cgexec "it bounds each tool call's processes and memory with a cgroup" \
  "tool calls run without a cgroup limit (rlimits only), and the run's start-up line says so"

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
  req_files=(requirements-gpu.txt requirements-gpu-te.txt)
  te_plan=$(bash scripts/te-plan.sh) || exit 1  # TransformerEngine: opt-in (LEAN_RL_TE=1), needs nvcc
  flavour=gpu-${te_plan%%:*}  # gpu-build / gpu-skip: switching LEAN_RL_TE reruns setup
  step "GPU machine; TransformerEngine: $te_plan"
else
  flavour=cpu
  req_files=(requirements.txt requirements-nodeps.txt)
fi

stamp="$venv/.lean_rl-setup-stamp"
want=$(cat "${req_files[@]}" pyproject.toml scripts/setup.sh scripts/te-plan.sh | sha256sum | cut -d' ' -f1)-$flavour
next_steps="main job: bash scripts/quickstart.sh   tests: bash scripts/test.sh"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" && -z "${LEAN_RL_FORCE_SETUP:-}" ]]; then
  echo "setup.sh: $venv is up to date ($flavour); $next_steps"
  exit 0
fi

quiet_pip() {  # the machine's pip config lists local mirrors that lack most packages: hide that noise
  "$venv/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2)
}
pip_with_progress() {  # pip -q prints nothing for minutes: say every 20 s that it is still at work
  local what=$1; shift
  quiet_pip "$@" &
  local pip_pid=$! waited=0
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 1
    waited=$(( waited + 1 ))
    if (( waited % 20 == 0 )); then
      local site count
      site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
      count=$(find "$site" -maxdepth 1 -name '*.dist-info' 2>/dev/null | wc -l)
      step "  ... still installing $what ($count packages in the venv so far)"
    fi
  done
  wait "$pip_pid" || { echo "setup.sh: pip could not install $what (its error is above); nothing else was changed" >&2
                       exit 1; }
}

if [[ -x "$venv/bin/python" ]]; then
  step "updating $venv ($flavour set; the requirement files changed or LEAN_RL_FORCE_SETUP is set)"
else
  step "creating $venv with $python_bin"
  "$python_bin" -m venv "$venv"
fi
if [[ $flavour == gpu-* ]]; then
  step "installing the pinned GPU set (requirements-gpu.txt: torch CUDA, full SGLang, Megatron-core; several minutes)"
  pip_with_progress requirements-gpu.txt install -q -r requirements-gpu.txt
  if [[ $flavour == gpu-build ]]; then
    step "building TransformerEngine against that torch (requirements-gpu-te.txt, --no-build-isolation; ${te_plan#build: })"
    pip_with_progress requirements-gpu-te.txt install -q --no-build-isolation -r requirements-gpu-te.txt
  fi
else
  step "installing the pinned CPU set (requirements.txt: torch CPU, Megatron-core, Ray, pytest, mypy, ...; 2-4 min on a fresh machine)"
  pip_with_progress requirements.txt install -q -r requirements.txt
  step "installing SGLang and torchvision without their CUDA dependencies (requirements-nodeps.txt)"
  pip_with_progress requirements-nodeps.txt install -q --no-deps -r requirements-nodeps.txt
fi
step "installing lean_rl itself (editable)"
pip_with_progress "lean_rl (-e .)" install -q --no-deps --no-build-isolation -e .
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
step "checking that lean_rl, torch, Megatron-core, SGLang, Ray and transformers import (~15 s)"
PYTHONWARNINGS=ignore "$venv/bin/python" -c "import lean_rl, torch, megatron.core, sglang, ray, transformers" \
  || { echo "setup.sh: the installed environment does not import; see the error above" >&2; exit 1; }
if [[ $flavour == gpu-build ]]; then
  # a TE extension built against another torch does not load, and Megatron then falls back silently
  "$venv/bin/python" -c "from megatron.core.transformer.moe import moe_utils; assert moe_utils.HAVE_TE" 2>/dev/null \
    || { echo "setup.sh: TransformerEngine is installed but Megatron-core cannot load it (built against another" \
              "torch?): rerun with LEAN_RL_FORCE_SETUP=1, or train with --transformer-impl local" >&2; exit 1; }
  step "TransformerEngine loads in Megatron-core (the TE layer spec will be used)"
fi
echo "$want" > "$stamp"
step "$flavour environment ready in $venv; $next_steps"
