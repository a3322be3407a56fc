#!/usr/bin/env bash
# Train a tool-calling agent (a Python calculator in a sandbox) with GRPO on CPU.
#   bash examples/tool_calling/run.sh [extra lean_rl.train flags]
# MODEL=path/to/hf_checkpoint picks the model (default: the tiny random test model, built here; it
# shows the machinery, not learning: see README.md). Outputs under $OUT (default outputs/tool_calling).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
OUT=${OUT:-outputs/tool_calling}
export OMP_NUM_THREADS=1 PYTHONPATH="$PWD/examples/tool_calling${PYTHONPATH:+:$PYTHONPATH}"

if [[ -z ${MODEL:-} ]]; then
   MODEL=$OUT/model
   [[ -f $MODEL/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$MODEL" --arch qwen2 --preset tiny --seed 0
fi
[[ -f $OUT/data/train.jsonl ]] || $PY examples/tool_calling/calculator_env.py --out "$OUT/data"

AGENT_ARGS=(
   --environment-path calculator_env.CalculatorEnv   # reward comes from the environment
   --max-turns 4 --max-tokens-per-turn 64 --environment-timeout 30
   --rollout-stop "</tool_call>"                     # a call ends the turn; the tool answers
)
ROLLOUT_ARGS=(
   --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --apply-chat-template
   --rollout-shuffle --num-rollout 20 --rollout-batch-size 4 --n-samples-per-prompt 4
   --rollout-max-response-len 256 --rollout-temperature 1.0
)
TRAIN_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2 --lr 1e-4 --lr-warmup-iters 2 --clip-grad 1.0
   --micro-batch-size 8 --rollout-num-engines 1 --sglang-max-total-tokens 16384
)
exec $PY -m lean_rl.train --hf-checkpoint "$MODEL" --output-dir "$OUT/run" \
   "${AGENT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${TRAIN_ARGS[@]}" "$@"
