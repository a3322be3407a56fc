#!/usr/bin/env bash
# Reward model -> GRPO, and DPO, on CPU, from preference pairs alone (issue 41's worked example).
#  1. preference pairs of the toy task (lean_rl/testing/toy_task.py), from its prompts: two random responses
#     each, the one the rule reward scores higher chosen (make_pairs.py; seed 0; held-out pairs from the eval
#     prompts, seed 1);
#  2. a reward model trained on them (--loss-type rm_loss: Bradley-Terry, a value head on the tiny model),
#     converted to Qwen2ForSequenceClassification, its held-out pair accuracy measured;
#  3. GRPO with that reward model served by the run (--rm-hf-checkpoint) as the only trained reward; the rule
#     reward is logged beside it, never trained on (rm_with_hidden_rule.py);
#  4. DPO on the same pairs (--loss-type dpo_loss), a checkpoint every quarter;
#  5. the main job (GRPO on the rule reward itself, scripts/run-tiny-cpu.sh) as the yardstick (MAIN=0 skips it);
#  6. every policy's rule reward on the eval prompts, the same way (evaluate.py: transformers, 4 samples a
#     prompt at temperature 1), and the plots (plots.py).
#   bash examples/reward_model_pipeline/run.sh          OUT=dir to write elsewhere (default outputs/reward_model_pipeline)
# Sizes (the defaults are the README's run): NUM_TRAIN prompts, PAIRS_PER_PROMPT, RM_STEPS, GRPO_STEPS,
# DPO_STEPS (32 pairs a step for the reward model and DPO, 8 prompts x 8 samples a step for GRPO), MAIN=0|1.
# Every stage starts over when rerun.
set -euo pipefail  # pipefail: train()'s tee keeps the run's exit status
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/reward_model_pipeline}
NUM_TRAIN=${NUM_TRAIN:-512}
PAIRS_PER_PROMPT=${PAIRS_PER_PROMPT:-4}
RM_STEPS=${RM_STEPS:-64}
GRPO_STEPS=${GRPO_STEPS:-40}
DPO_STEPS=${DPO_STEPS:-64}
MAIN=${MAIN:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$HERE:$PWD${PYTHONPATH:+:$PYTHONPATH}"   # rm_with_hidden_rule; this checkout's lean_rl
rm -rf "$OUT/rm" "$OUT/grpo" "$OUT/dpo" "$OUT/results.jsonl"
mkdir -p "$OUT"
started=$SECONDS

# a run ("$@"), its output also in $OUT/train.log; run again (up to twice more) only when the local Ray
# failed to start: Ray waits a fixed 30 s for its raylet (ray/_private/node.py), which a loaded 2-core
# machine can miss (seen at load ~20); any other failure stops the script.
retry_ray_start() {
   for attempt in 1 2 3; do
      if "$@" 2>&1 | tee "$OUT/train.log"; then return 0; fi
      grep -q "The current node timed out during startup" "$OUT/train.log" || return 1
      echo "run.sh: Ray's node did not start in its 30 s (attempt $attempt of 3); again"
   done
   return 1
}
train() { retry_ray_start $PY -m lean_rl.train "$@"; }

echo "== 1/6 the tiny model, the toy task's prompts, preference pairs ($OUT/data)"
[[ -f $OUT/model/config.json ]] || $PY -m lean_rl.testing.tiny_model --out "$OUT/model" --arch qwen2 --preset tiny --seed 0
$PY -m lean_rl.testing.toy_task --out "$OUT/data" --num-train "$NUM_TRAIN"
$PY "$HERE/make_pairs.py" --model "$OUT/model" --prompts "$OUT/data/train.jsonl" --out "$OUT/data/pairs.jsonl" \
   --pairs-per-prompt "$PAIRS_PER_PROMPT" --seed 0
$PY "$HERE/make_pairs.py" --model "$OUT/model" --prompts "$OUT/data/eval.jsonl" --out "$OUT/data/heldout_pairs.jsonl" \
   --pairs-per-prompt 8 --seed 1

# what the reward model and DPO share: the pairs, 32 a step, one optimizer step per rollout
PAIR_ARGS=(
   --hf-checkpoint "$OUT/model" --no-tensorboard
   --prompt-data "$OUT/data/pairs.jsonl" --input-key prompt --chosen-key chosen --rejected-key rejected
   --rollout-shuffle --n-samples-per-prompt 2 --rollout-batch-size 32 --micro-batch-size 16
   --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style constant --weight-decay 0.0 --clip-grad 1.0
)

echo "== 2/6 the reward model: Bradley-Terry, $RM_STEPS steps; -> HF sequence classification; held-out accuracy"
train "${PAIR_ARGS[@]}" --output-dir "$OUT/rm/run" --loss-type rm_loss --num-rollout "$RM_STEPS" \
   --save "$OUT/rm/ckpt" --save-interval "$RM_STEPS"
$PY -m lean_rl.convert megatron-to-hf --load "$OUT/rm/ckpt" --save "$OUT/rm/hf" --hf-config "$OUT/model"
$PY "$HERE/evaluate.py" rm-accuracy --rm "$OUT/rm/hf" --pairs "$OUT/data/heldout_pairs.jsonl" --out "$OUT/results.jsonl"

echo "== 3/6 GRPO against the served reward model ($GRPO_STEPS steps); the rule reward only logged"
train --hf-checkpoint "$OUT/model" --output-dir "$OUT/grpo/run" --no-tensorboard \
   --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
   --rm-hf-checkpoint "$OUT/rm/hf" --custom-rm-path rm_with_hidden_rule.reward --reward-key rm \
   --num-rollout "$GRPO_STEPS" --rollout-batch-size 8 --n-samples-per-prompt 8 \
   --rollout-max-response-len 12 --rollout-temperature 1.0 \
   --eval-prompt-data toy "$OUT/data/eval.jsonl" --eval-interval 10 --n-samples-per-eval-prompt 4 \
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0 \
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 \
   --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192 \
   --save "$OUT/grpo/ckpt" --save-interval "$GRPO_STEPS" \
   --save-debug-rollout-data "$OUT/grpo/rollouts/{rollout_id}.jsonl"   # what the policy learned to say
$PY -m lean_rl.convert megatron-to-hf --load "$OUT/grpo/ckpt" --save "$OUT/grpo/hf" --hf-config "$OUT/model"

echo "== 4/6 DPO on the same pairs ($DPO_STEPS steps, beta 0.1), a checkpoint every quarter"
quarter=$(( DPO_STEPS / 4 > 0 ? DPO_STEPS / 4 : 1 ))
train "${PAIR_ARGS[@]}" --output-dir "$OUT/dpo/run" --loss-type dpo_loss --dpo-beta 0.1 \
   --num-rollout "$DPO_STEPS" --save "$OUT/dpo/ckpt" --save-interval "$quarter"
dpo_steps=()
for iteration in $(seq "$quarter" "$quarter" "$DPO_STEPS"); do
   $PY -m lean_rl.convert megatron-to-hf --load "$OUT/dpo/ckpt" --iteration "$iteration" \
      --save "$OUT/dpo/hf/step_$iteration" --hf-config "$OUT/model"
   dpo_steps+=("$OUT/dpo/hf/step_$iteration")
done

main=()
if [[ $MAIN == 1 ]]; then
   echo "== 5/6 the yardstick: the main job, GRPO on the rule reward itself ($OUT/main)"
   [[ -f $OUT/main/hf/config.json ]] || {
      rm -rf "$OUT/main"
      retry_ray_start env OUT="$OUT/main" bash scripts/run-tiny-cpu.sh --num-rollout "$GRPO_STEPS" --save-interval "$GRPO_STEPS" --no-tensorboard
      $PY -m lean_rl.convert megatron-to-hf --load "$OUT/main/ckpt" --save "$OUT/main/hf" --hf-config "$OUT/main/model"
   }
   main=("$OUT/main/hf")
else
   echo "== 5/6 the main job skipped (MAIN=0)"
fi

echo "== 6/6 the rule reward of every policy on the eval prompts, the plots"
$PY "$HERE/evaluate.py" rule-reward --policy "$OUT/model" "${main[@]}" "$OUT/grpo/hf" "${dpo_steps[@]}" \
   --prompts "$OUT/data/eval.jsonl" --out "$OUT/results.jsonl"
$PY "$HERE/plots.py" "$OUT" | tee "$OUT/summary.md"
echo "done in $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s: $OUT/summary.md, $OUT/*.png"
