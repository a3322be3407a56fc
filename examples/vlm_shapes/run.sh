#!/usr/bin/env bash
# The example's learning run on CPU (README.md): shapes rows, the warm-started tiny VLM, GRPO with lean_rl
# (SGLang generates from the images, Megatron + the HF vision tower trains), held-out evaluation with the
# true images and with shuffled ones (a policy that does not look scores the same on both).
#   bash examples/vlm_shapes/run.sh [extra lean_rl.train flags]        (OUT=dir to write elsewhere)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
OUT=${OUT:-outputs/vlm_shapes}
HERE=examples/vlm_shapes
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD:$PWD/$HERE${PYTHONPATH:+:$PYTHONPATH}

[[ -f $OUT/train/prompts.jsonl ]] || $PY $HERE/shapes_task.py --out $OUT/train --n 256 --seed 0 --question total
[[ -f $OUT/eval/prompts.jsonl ]] || $PY $HERE/shapes_task.py --out $OUT/eval --n 64 --seed 7 --question total
[[ -f $OUT/eval/shuffled.jsonl ]] || $PY $HERE/warm_start.py --rows $OUT/eval/prompts.jsonl --write-shuffled $OUT/eval/shuffled.jsonl
# the "pretrained" stand-in: 140 supervised steps on rows of another seed (warm_start.py)
[[ -f $OUT/model/warm/config.json ]] || $PY $HERE/warm_start.py --out $OUT/model --steps 140 --seed 0

$PY -m lean_rl.train --output-dir $OUT/run --hf-checkpoint $OUT/model/warm --save-hf $OUT/hf --save-interval 100 \
   --save $OUT/ckpt \
   --prompt-data $OUT/train/prompts.jsonl --multimodal-keys '{"image": "images"}' --apply-chat-template \
   --label-key label --rollout-shuffle --custom-rm-path shapes_task.shape_total_reward \
   --num-rollout 100 --rollout-batch-size 8 --n-samples-per-prompt 8 --rollout-max-response-len 4 \
   --rollout-temperature 1.0 \
   --eval-prompt-data shapes $OUT/eval/prompts.jsonl --eval-prompt-data shuffled $OUT/eval/shuffled.jsonl \
   --eval-interval 10 \
   --n-samples-per-eval-prompt 1 \
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0 \
   --lr 1e-3 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0 --micro-batch-size 16 \
   --rollout-num-engines 1 --sglang-max-total-tokens 8192 --no-tensorboard "$@"
