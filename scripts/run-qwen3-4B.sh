#!/usr/bin/env bash
# GRPO on Qwen3-4B with math rewards, on one node with 8 GPUs: 4 for the Megatron trainer (TP 2 x DP 2),
# 4 for SGLang (2 engines of TP 2). Same shape as run-tiny-cpu.sh; only the sizes and devices change.
# Not runnable on the project's CPU CI (written for real, checked only on a GPU machine).
#   HF=/models/Qwen3-4B DATA=/data/dapo-math-17k.jsonl bash scripts/run-qwen3-4B.sh [extra flags]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${HF:?set HF to the Qwen3-4B HF checkpoint directory}"
: "${DATA:?set DATA to a jsonl/parquet prompt file with prompt + label columns}"
OUT=${OUT:-outputs/qwen3-4B}
source scripts/models/qwen3-4B.sh   # MODEL_ARGS=( ... ), checked against $HF/config.json

CKPT_ARGS=(
   --hf-checkpoint "$HF" --save $OUT/ckpt --load $OUT/ckpt --save-interval 20
)
ROLLOUT_ARGS=(
   --prompt-data "$DATA" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
   --rm-type math --num-rollout 3000 --rollout-batch-size 32 --n-samples-per-prompt 8
   --rollout-max-response-len 8192 --rollout-temperature 1.0
   --over-sampling-batch-size 64 --dynamic-sampling-filter-path lean_rl.rollout.filters.reward_varies
)
ALGO_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28 --kl-loss-coef 0.0 --entropy-coef 0.0
   --use-tis
)
OPTIMIZER_ARGS=(
   --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 --clip-grad 1.0
)
PERF_ARGS=(
   --bf16 --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1
   --actor-num-nodes 1 --actor-num-gpus-per-node 4
   --use-dynamic-batch-size --max-tokens-per-gpu 9216 --seq-length 10240
   --rollout-num-gpus 4 --rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.8
)
exec .venv/bin/python -m lean_rl.train --output-dir $OUT/run "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${PERF_ARGS[@]}" "$@"
