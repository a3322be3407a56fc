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
shopt -s nullglob  # a glob that matches nothing is no word
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
ROUNDS=${ROUNDS:-4}                       # GRPO in ROUNDS rounds of GRPO_STEPS / ROUNDS steps
KL_COEF=${KL_COEF:-0.01}                  # GRPO's KL loss to the start (low_var_kl)
ONPOLICY_PAIRS_PER_GROUP=${ONPOLICY_PAIRS_PER_GROUP:-8}
(( ROUNDS >= 1 && GRPO_STEPS % ROUNDS == 0 )) || { echo "run.sh: GRPO_STEPS=$GRPO_STEPS must be a multiple of ROUNDS=$ROUNDS" >&2; exit 2; }
PER_ROUND=$(( GRPO_STEPS / ROUNDS ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$HERE:$PWD${PYTHONPATH:+:$PYTHONPATH}"   # rm_with_hidden_rule; this checkout's lean_rl
rm -rf "$OUT/rm" "$OUT/grpo" "$OUT/dpo" "$OUT/results.jsonl" "$OUT"/data/onpolicy_*.jsonl
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
   --input-key prompt --chosen-key chosen --rejected-key rejected
   --rollout-shuffle --n-samples-per-prompt 2 --rollout-batch-size 32 --micro-batch-size 16
   --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style constant --weight-decay 0.0 --clip-grad 1.0
)

# the reward model of round $1 (0: the pairs alone; k: the pairs and the policy's pairs of GRPO rounds 1..k),
# fitted from the start on all of them (InstructGPT refitted on every comparison collected so far), converted
# to HF; its held-out accuracy on the random pairs' held-out set
fit_reward_model() {
   local round=$1 dir="$OUT/rm/round_$1" data="$OUT/data/rm_pairs_$1.jsonl"
   cat "$OUT/data/pairs.jsonl" "$OUT"/data/onpolicy_*.jsonl > "$data"   # nullglob: none in round 0
   echo "reward model, round $round: $(wc -l < "$data") pairs ($data)"
   train "${PAIR_ARGS[@]}" --prompt-data "$data" --output-dir "$dir/run" --loss-type rm_loss --num-rollout "$RM_STEPS" \
      --save "$dir/ckpt" --save-interval "$RM_STEPS"
   $PY -m lean_rl.convert megatron-to-hf --load "$dir/ckpt" --save "$dir/hf" --hf-config "$OUT/model"
   $PY "$HERE/evaluate.py" rm-accuracy --rm "$dir/hf" --pairs "$OUT/data/heldout_pairs.jsonl" --out "$OUT/results.jsonl"
}

echo "== 2/6 the reward model: Bradley-Terry, $RM_STEPS steps; -> HF sequence classification; held-out accuracy"
fit_reward_model 0

# GRPO against the served reward model of the round before, KL to the start (--kl-loss-coef: the policy
# stays near where the reward model has seen samples); each round goes on from the last one's checkpoint
# (optimizer, data position, step), its samples saved (--save-debug-rollout-data) for the next pairs
grpo_round() {
   local round=$1 last=$(( $1 * PER_ROUND )) resume=()
   [[ $round == 1 ]] || resume=(--load "$OUT/grpo/ckpt")
   train --hf-checkpoint "$OUT/model" --output-dir "$OUT/grpo/run" --no-tensorboard "${resume[@]}" \
      --prompt-data "$OUT/data/train.jsonl" --input-key prompt --label-key label --rollout-shuffle \
      --rm-hf-checkpoint "$OUT/rm/round_$(( round - 1 ))/hf" --custom-rm-path rm_with_hidden_rule.reward --reward-key rm \
      --num-rollout "$last" --rollout-batch-size 8 --n-samples-per-prompt 8 \
      --rollout-max-response-len 12 --rollout-temperature 1.0 \
      --eval-prompt-data toy "$OUT/data/eval.jsonl" --eval-interval "$PER_ROUND" --n-samples-per-eval-prompt 4 \
      --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef "$KL_COEF" --kl-loss-type low_var_kl --entropy-coef 0.0 \
      --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 \
      --micro-batch-size 16 --rollout-num-engines 1 --sglang-max-total-tokens 8192 \
      --save "$OUT/grpo/ckpt" --save-interval "$PER_ROUND" \
      --save-debug-rollout-data "$OUT/grpo/rollouts/{rollout_id}.jsonl"
   $PY -m lean_rl.convert megatron-to-hf --load "$OUT/grpo/ckpt" --iteration "$last" --save "$OUT/grpo/hf/round_$round" \
      --hf-config "$OUT/model"
}

echo "== 3/6 GRPO against the served reward model: $ROUNDS round(s) of $PER_ROUND steps, the reward model refitted"
echo "   between rounds on pairs of the policy's samples (labelled by the rule, which is otherwise only logged)"
for round in $(seq 1 "$ROUNDS"); do
   grpo_round "$round"
   (( round < ROUNDS )) || break
   $PY "$HERE/onpolicy_pairs.py" --rollouts "$OUT/grpo/rollouts/{rollout_id}.jsonl" \
      --steps $(( (round - 1) * PER_ROUND )) $(( round * PER_ROUND )) --out "$OUT/data/onpolicy_$round.jsonl" \
      --pairs-per-group "$ONPOLICY_PAIRS_PER_GROUP" --seed "$round"
   # how well the reward model that round trained on ranks the policy's own samples (what GRPO exploits)
   $PY "$HERE/evaluate.py" rm-accuracy --rm "$OUT/rm/round_$(( round - 1 ))/hf" --pairs "$OUT/data/onpolicy_$round.jsonl" \
      --out "$OUT/results.jsonl"
   fit_reward_model "$round"
done

echo "== 4/6 DPO on the same pairs ($DPO_STEPS steps, beta 0.1), a checkpoint every quarter"
quarter=$(( DPO_STEPS / 4 > 0 ? DPO_STEPS / 4 : 1 ))
train "${PAIR_ARGS[@]}" --prompt-data "$OUT/data/pairs.jsonl" --output-dir "$OUT/dpo/run" \
   --loss-type dpo_loss --dpo-beta 0.1 --num-rollout "$DPO_STEPS" --save "$OUT/dpo/ckpt" --save-interval "$quarter"
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
$PY "$HERE/evaluate.py" rule-reward --policy "$OUT/model" "${main[@]}" "$OUT"/grpo/hf/round_* "${dpo_steps[@]}" \
   --prompts "$OUT/data/eval.jsonl" --out "$OUT/results.jsonl"
$PY "$HERE/plots.py" "$OUT" | tee "$OUT/summary.md"
echo "done in $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s: $OUT/summary.md, $OUT/*.png"
