#!/bin/bash
# Megatron architecture flags for glm4.5-air (glm4_moe), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 46
   --hidden-size 4096
   --ffn-hidden-size 10944
   --num-attention-heads 96
   --group-query-attention
   --num-query-groups 8
   --kv-channels 128
   --normalization RMSNorm
   --norm-epsilon 1e-05
   --swiglu
   --add-qkv-bias
   --untie-embeddings-and-output-weights
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 1000000
   --vocab-size 151552
   --max-position-embeddings 131072
   --rotary-percent 0.5
   --num-experts 128
   --moe-router-topk 8
   --moe-ffn-hidden-size 1408
   --moe-layer-freq '([0]*1+[1]*45)'
   --moe-shared-expert-intermediate-size 1408
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-topk-scaling-factor 1
)
