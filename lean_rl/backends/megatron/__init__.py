"""Megatron-core trainer side. Driver-side entry point: group.MegatronActorGroup (one Ray actor per
rank, actor.MegatronRankWorker). Configuration: config (typed flags), hf_config (from HF config.json).
Rank-side: compat (CPU/gloo/no-TE fixes), distributed, model, logprobs, scoring; HF weights in
hf_weights/. Importing config, hf_config, scoring_plan, group or hf_weights.{families,layouts} does not
import Megatron."""
