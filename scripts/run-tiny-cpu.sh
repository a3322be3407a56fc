#!/usr/bin/env bash
# The main job on CPU: GRPO on a tiny random-init Qwen2 (lean_rl.testing.tiny_model) for the toy task
# of lean_rl/testing/toy_task.py (answer in digits or in letters; reward = fraction of tokens of that kind), with real
# SGLang + sglang-router for rollout and real Megatron-core (gloo) for training. Reward climbs from
# ~0.1 to near 1.0 in a few minutes on 2 cores. Rerunning the same command resumes from the last
# checkpoint in $OUT/ckpt (delete $OUT to start over). Extra flags are passed through.
#   bash scripts/run-tiny-cpu.sh [--num-rollout 40] [--async-mode one-step] ...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
OUT=${OUT:-outputs/tiny-cpu}   # OUT=dir to write elsewhere
export OMP_NUM_THREADS=1

[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out $OUT/model --arch qwen2 --preset tiny --seed 0
[[ -f $OUT/data/train.jsonl ]] || $PY -m lean_rl.testing.toy_task --out $OUT/data

# The architecture comes from $OUT/model/config.json; for real models add "${MODEL_ARGS[@]}" from
# scripts/models/*.sh (they are checked against the HF config).
CKPT_ARGS=(
   --hf-checkpoint $OUT/model
   --save $OUT/ckpt --load $OUT/ckpt --save-interval 10
)
ROLLOUT_ARGS=(
   --prompt-data $OUT/data/train.jsonl --input-key prompt --label-key label --rollout-shuffle
   --custom-rm-path lean_rl.testing.toy_task.kind_fraction_reward
   --num-rollout 40 --rollout-batch-size 8 --n-samples-per-prompt 8
   --rollout-max-response-len 12 --rollout-temperature 1.0
)
EVAL_ARGS=(
   --eval-prompt-data toy $OUT/data/eval.jsonl --eval-interval 10 --n-samples-per-eval-prompt 4
)
ALGO_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0
)
OPTIMIZER_ARGS=(
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0
)
PERF_ARGS=(
   --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --micro-batch-size 16
   --rollout-num-engines 1 --sglang-max-total-tokens 8192
)
exec $PY -m lean_rl.train --output-dir $OUT/run "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" \
   "${ALGO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${PERF_ARGS[@]}" "$@"
