#!/usr/bin/env bash
# GRPO on the tiny CPU model, the rollouts made by an unmodified openai-client agent (toy_agent.py)
# through lean_rl's OpenAI capture endpoint. Extra flags are passed through (later ones win):
#   bash examples/openai_agent/run.sh [--num-rollout 2] ...      OUT=dir to write elsewhere
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/openai-agent}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"   # toy_agent and toy_agent_hooks

[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$OUT/model" --arch qwen2 --preset tiny --seed 0
[[ -f $OUT/data/train.jsonl ]] || $PY -m lean_rl.testing.toy_task --out "$OUT/data"

exec $PY -m lean_rl.train --hf-checkpoint "$OUT/model" --output-dir "$OUT/run" \
   --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
   --custom-generate-function-path toy_agent_hooks.generate \
   --custom-rm-path toy_agent_hooks.model_tokens_kind_fraction \
   --num-rollout 20 --rollout-batch-size 8 --n-samples-per-prompt 8 \
   --rollout-max-response-len 40 --rollout-temperature 1.0 \
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0 \
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 \
   --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192 \
   --dump-samples-interval 1 "$@"
