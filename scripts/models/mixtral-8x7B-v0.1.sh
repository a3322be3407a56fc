#!/bin/bash
# Megatron architecture flags for mixtral-8x7B-v0.1 (mixtral), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 32
   --hidden-size 4096
   --ffn-hidden-size 14336
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --swiglu
   --untie-embeddings-and-output-weights
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 1000000
   --vocab-size 32000
   --max-position-embeddings 32768
   --num-experts 8
   --moe-router-topk 2
   --moe-ffn-hidden-size 14336
)
