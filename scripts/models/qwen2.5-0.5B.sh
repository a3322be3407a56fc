#!/bin/bash
# Megatron architecture flags for qwen2.5-0.5B (qwen2), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 24
   --hidden-size 896
   --ffn-hidden-size 4864
   --num-attention-heads 14
   --group-query-attention
   --num-query-groups 2
   --kv-channels 64
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --swiglu
   --add-qkv-bias
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 1000000
   --vocab-size 151936
   --max-position-embeddings 32768
)
