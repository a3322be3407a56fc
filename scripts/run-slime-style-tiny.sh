#!/usr/bin/env bash
# A launch script written as slime's examples are (bash arrays of slime's flags, the Megatron model
# flags sourced from a models file), run on lean_rl: the only change from a slime script is the
# launcher line, `python3 train.py` -> `python3 -m lean_rl.slime_launch train.py`. The tiny model and
# toy task of scripts/run-tiny-cpu.sh; docs/slime_flags.md says what lean_rl does with each flag.
#   bash scripts/run-slime-style-tiny.sh [--num-rollout 2] ...     (OUT=dir to write elsewhere)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/slime-style-tiny}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out $OUT/model --arch qwen2 --preset tiny --seed 0
[[ -f $OUT/data/train.jsonl ]] || $PY -m lean_rl.testing.toy_task --out $OUT/data
# slime sources scripts/models/<model>.sh; lean_rl prints the same MODEL_ARGS=(...) from the HF config
[[ -f $OUT/model_args.sh ]] || $PY -m lean_rl.convert hf-to-megatron --hf $OUT/model --print-megatron-args > $OUT/model_args.sh
source $OUT/model_args.sh

CKPT_ARGS=(
   --hf-checkpoint $OUT/model
   --save $OUT/ckpt
   --save-interval 100
)

ROLLOUT_ARGS=(
   --prompt-data $OUT/data/train.jsonl
   --input-key prompt
   --label-key label
   --rollout-shuffle
   --rollout-seed 42
   --custom-rm-path lean_rl.testing.toy_task.kind_fraction_reward
   --num-rollout 3
   --rollout-batch-size 8
   --n-samples-per-prompt 8
   --over-sampling-batch-size 8
   --rollout-max-response-len 12
   --rollout-temperature 1
   --rollout-top-p 1.0
   --global-batch-size 64
   --balance-data
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data toy $OUT/data/eval.jsonl
   --n-samples-per-eval-prompt 2
   --eval-max-response-len 12
   --eval-top-p 1.0
)

PERF_ARGS=(
   --tensor-model-parallel-size 1
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 4096
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --entropy-coef 0.00
   --eps-clip 0.2
   --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-3
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
)

WANDB_ARGS=(
   --wandb-project slime-style-tiny
   --wandb-group tiny-cpu
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
   --sglang-server-concurrency 64
   --sglang-max-total-tokens 8192
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

# lean_rl's own flags for a CPU machine (slime's scripts place GPUs with Ray instead)
CPU_ARGS=(
   --rollout-num-engines 1
   --output-dir $OUT/run
   --no-tensorboard
)

exec $PY -m lean_rl.slime_launch train.py \
   --actor-num-nodes 1 \
   --actor-num-gpus-per-node 1 \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${WANDB_ARGS[@]}" \
   "${SGLANG_ARGS[@]}" \
   "${MISC_ARGS[@]}" \
   "${CPU_ARGS[@]}" \
   "$@"
