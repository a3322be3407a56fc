#!/bin/bash
# Megatron architecture flags for qwen3-4B (qwen3), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 36
   --hidden-size 2560
   --ffn-hidden-size 9728
   --num-attention-heads 32
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
