#!/bin/bash
# Megatron architecture flags for qwen3-30B-A3B (qwen3_moe), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 48
   --hidden-size 2048
   --ffn-hidden-size 6144
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 4
   --kv-channels 128
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --swiglu
   --qk-layernorm
   --untie-embeddings-and-output-weights
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 1000000
   --vocab-size 151936
   --max-position-embeddings 40960
   --num-experts 128
   --moe-router-topk 8
   --moe-ffn-hidden-size 768
)
