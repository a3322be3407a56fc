#!/usr/bin/env bash
# On-policy distillation that learns a task with no task reward: the teacher is the main job's trained
# policy (scripts/run-tiny-cpu.sh, GRPO to reward ~1.0, converted to HF), the student a tiny model of
# another seed, trained only on its reverse KL to the teacher on its own samples. Two runs on the same
# seed: --opd-estimator topk (the default: the teacher's top-k plus a tail bucket) and sampled (slime's
# per-token k1 on the sampled token), both with the teacher on SGLang; then topk with the teacher inside
# the trainer (--opd-type megatron). The task reward of each run's samples is scored afterwards.
#   bash examples/distillation/run.sh [--num-rollout 30] ...      OUT=dir to write elsewhere, SEED=n
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/distillation}
SEED=${SEED:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

echo "== 1/4 the teacher: the main job (GRPO, 40 steps) in $OUT/main"
[[ -f $OUT/main/ckpt/latest_checkpointed_iteration.txt && $(cat $OUT/main/ckpt/latest_checkpointed_iteration.txt) == 40 ]] \
   || OUT=$OUT/main bash scripts/run-tiny-cpu.sh --save-interval 40
echo "== 2/4 its last checkpoint -> HF ($OUT/teacher)"
[[ -f $OUT/teacher/config.json ]] || $PY tools/convert_ckpt/megatron_to_hf.py --load "$OUT/main/ckpt" --save "$OUT/teacher" \
   --hf-config "$OUT/main/model"
echo "== 3/4 the student: a tiny model of seed $SEED ($OUT/student)"
[[ -f $OUT/student/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$OUT/student" --arch qwen2 --preset tiny --seed "$SEED"

echo "== 4/4 distillation, no task reward: --opd-estimator topk, then sampled (the teacher on SGLang), then"
echo "       topk with the teacher inside the trainer (--opd-type megatron, its Megatron checkpoint as it is)"
for run in topk sampled megatron; do
   estimator=$([[ $run == sampled ]] && echo sampled || echo topk)
   teacher=(--opd-type sglang --opd-teacher-hf-checkpoint "$OUT/teacher")
   [[ $run == megatron ]] && teacher=(--opd-type megatron --opd-teacher-load "$OUT/main/ckpt")
   rm -rf "$OUT/$run"
   $PY -m lean_rl.train --hf-checkpoint "$OUT/student" --output-dir "$OUT/$run" --seed "$SEED" \
      --prompt-data "$OUT/main/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
      --num-rollout 30 --rollout-batch-size 8 --n-samples-per-prompt 4 \
      --rollout-max-response-len 12 --rollout-temperature 1.0 \
      --use-opd "${teacher[@]}" --opd-estimator "$estimator" \
      --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0 \
      --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 \
      --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192 \
      --save-debug-rollout-data "$OUT/$run/rollouts/{rollout_id}.jsonl" "$@"
done
$PY "$HERE/task_reward.py" --model "$OUT/student" "$OUT/topk/rollouts" "$OUT/sampled/rollouts" "$OUT/megatron/rollouts" \
   | tee "$OUT/curve.md"
