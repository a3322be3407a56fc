#!/bin/bash
# Megatron architecture flags for qwen3-0.6B (qwen3), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 28
   --hidden-size 1024
   --ffn-hidden-size 3072
   --num-attention-heads 16
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --swiglu
   --qk-layernorm
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 1000000
   --vocab-size 151936
   --max-position-embeddings 40960
)
