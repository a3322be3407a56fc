#!/bin/bash
# Megatron architecture flags for deepseek-v3 (deepseek_v3), derived from its
# HF config.json by: python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
MODEL_ARGS=(
   --num-layers 61
   --hidden-size 7168
   --ffn-hidden-size 18432
   --num-attention-heads 128
   --kv-channels 128
   --normalization RMSNorm
   --norm-epsilon 1e-06
   --swiglu
   --qk-layernorm
   --untie-embeddings-and-output-weights
   --disable-bias-linear
   --position-embedding-type rope
   --rotary-base 10000
   --vocab-size 129280
   --max-position-embeddings 163840
   --multi-latent-attention
   --q-lora-rank 1536
   --kv-lora-rank 512
   --rope-type yarn
   --rotary-scaling-factor 40
   --mscale-all-dim 1
   --num-experts 256
   --moe-router-topk 8
   --moe-ffn-hidden-size 2048
   --moe-layer-freq '([0]*3+[1]*58)'
   --moe-shared-expert-intermediate-size 2048
   --moe-router-score-function sigmoid
   --moe-router-enable-expert-bias
   --moe-router-num-groups 8
   --moe-router-group-topk 4
   --moe-router-topk-scaling-factor 2.5
)
