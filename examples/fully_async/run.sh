#!/usr/bin/env bash
# Fully async GRPO on CPU with a long-tailed response-length distribution (long_tail.py): the tiny
# random Qwen2 of scripts/run-tiny-cpu.sh learns the toy task (lean_rl/testing/toy_task.py) while
# the generator never stops; nothing trained is more than --max-staleness 2 policy versions old.
#   bash examples/fully_async/run.sh [extra flags]              # MODE=full (default): train_async --async-mode full
#   MODE=sync bash examples/fully_async/run.sh [extra flags]    # the synchronous loop, same data and workload
# Outputs under $OUT (default outputs/fully_async): model/, data/, run-$MODE/ (metrics.jsonl, curves.png,
# samples/). A rerun starts the run over (add --save DIR --load DIR to resume instead).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
OUT=${OUT:-outputs/fully_async}
MODE=${MODE:-full}
export OMP_NUM_THREADS=1 PYTHONPATH="$PWD/examples/fully_async${PYTHONPATH:+:$PYTHONPATH}"

[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$OUT/model" --arch qwen2 --preset tiny --seed 0
[[ -f $OUT/data/train.jsonl ]] || $PY -m lean_rl.testing.toy_task --out "$OUT/data"

ROLLOUT_ARGS=(
   --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle
   --custom-rm-path lean_rl.testing.toy_task.kind_fraction_reward
   --custom-generate-function-path long_tail.generate     # 95% of budgets 6-12 tokens, 5% 10-20x that
   --num-rollout 16 --rollout-batch-size 8 --n-samples-per-prompt 8
   --rollout-max-response-len 256 --rollout-temperature 1.0
   --dump-samples-interval 1                              # run-$MODE/samples/step_*.jsonl: lengths, versions
)
ALGO_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2
   # AReaL's decoupled PPO: clip against the recomputed (proximal) policy and weight each token by
   # exp(proximal - behaviour), so tokens made by an older policy are corrected; tokens whose weight
   # exceeds the cap are dropped (train/behav_dropped_frac). On-policy (sync) the weight is 1.
   --decoupled-ppo --behav-imp-weight-cap 5
)
TRAIN_ARGS=(
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 --micro-batch-size 16
   --rollout-num-engines 1 --sglang-max-total-tokens 32768
)
case $MODE in
   full) LOOP=(lean_rl.train_async --async-mode full --max-staleness 2) ;;
   sync) LOOP=(lean_rl.train) ;;
   *) echo "MODE=$MODE: choose full or sync" >&2; exit 2 ;;
esac
exec $PY -m "${LOOP[@]}" --hf-checkpoint "$OUT/model" --output-dir "$OUT/run-$MODE" \
   "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}" "${TRAIN_ARGS[@]}" "$@"
