#!/usr/bin/env bash
# GRPO on the tiny CPU model over a verifiers environment (toy_env.py): the environment's dataset,
# its own rollout (through lean_rl's capture endpoint) and its rubric, nothing of lean_rl's task code.
# Needs the optional extra: .venv/bin/pip install -r requirements-envs.txt -c requirements.txt
#   bash examples/verifiers_env/run.sh [--num-rollout 4] ...      OUT=dir to write elsewhere
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/verifiers-env}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"   # toy_env
$PY -c "import verifiers" 2>/dev/null || { echo "verifiers is not installed: $PY -m pip install -r requirements-envs.txt -c requirements.txt" >&2; exit 2; }

[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$OUT/model" --arch qwen2 --preset tiny --seed 0
export TOY_ENV_MODEL="$OUT/model"

exec $PY -m lean_rl.train --hf-checkpoint "$OUT/model" --output-dir "$OUT/run" \
   --verifiers-env toy_env.load_environment --rollout-shuffle --rollout-max-response-len 12 \
   --num-rollout 20 --rollout-batch-size 8 --n-samples-per-prompt 8 --rollout-temperature 1.0 \
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0 \
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 \
   --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192 \
   --dump-samples-interval 1 "$@"
