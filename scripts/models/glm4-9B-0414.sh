#!/bin/bash
# Megatron architecture flags for glm4-9B-0414 (glm4), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 40
   --hidden-size 4096
   --ffn-hidden-size 13696
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 2
   --kv-channels 128
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --swiglu
   --add-qkv-bias
   --untie-embeddings-and-output-weights
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 10000
   --vocab-size 151552
   --max-position-embeddings 32768
   --rotary-percent 0.5
   --rotary-interleaved
   --post-self-attn-layernorm
   --post-mlp-layernorm
)
