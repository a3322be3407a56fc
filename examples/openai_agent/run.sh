#!/usr/bin/env bash
# GRPO on the tiny CPU model, the rollouts made by an unmodified openai-client agent through lean_rl's
# OpenAI capture endpoint. Extra flags are passed through (later ones win):
#   bash examples/openai_agent/run.sh [--num-rollout 2] ...      OUT=dir to write elsewhere
#   AGENT=calculator bash examples/openai_agent/run.sh             the tool-calling task (calculator_agent.py)
# AGENT=toy (default): toy_agent.py on the toy task, which the tiny model learns in minutes.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/openai-agent}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"   # toy_agent and toy_agent_hooks

[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$OUT/model" --arch qwen2 --preset tiny --seed 0
if [[ ${AGENT:-toy} == calculator ]]; then
   [[ -f $OUT/data/calculator.jsonl ]] || $PY "$HERE/calculator_hooks.py" "$OUT/data/calculator.jsonl"
   TASK_ARGS=(--prompt-data "$OUT/data/calculator.jsonl" --custom-generate-function-path calculator_hooks.generate
              --rollout-max-response-len 256)   # the reward is set by calculator_hooks.generate
else
   [[ -f $OUT/data/train.jsonl ]] || $PY -m lean_rl.testing.toy_task --out "$OUT/data"
   TASK_ARGS=(--prompt-data "$OUT/data/train.jsonl" --custom-generate-function-path toy_agent_hooks.generate
              --custom-rm-path toy_agent_hooks.model_tokens_kind_fraction --rollout-max-response-len 40)
fi

exec $PY -m lean_rl.train --hf-checkpoint "$OUT/model" --output-dir "$OUT/run" \
   "${TASK_ARGS[@]}" --input-key prompt --label-key label --rollout-shuffle \
   --num-rollout 20 --rollout-batch-size 8 --n-samples-per-prompt 8 --rollout-temperature 1.0 \
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0 \
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 \
   --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192 \
   --dump-samples-interval 1 "$@"
