"""Megatron-core trainer side. Driver-side entry point: group.MegatronActorGroup (one Ray actor per
rank, actor.MegatronRankWorker). Configuration: config (typed flags), hf_config (from HF config.json).
Rank-side: compat (CPU/gloo/no-TE fixes), distributed, model, logprobs, scoring; HF weights in
hf_weights/. Training (issue 4): train_config (flags), rollout_batch + train_batches (groups -> per-DP
micro-batches, pure), train_driver (driver side of MegatronActorGroup.train / initialize_for_training),
rank_trainer (rank side: optimizer_setup, train_step, reference, value_head, checkpoint, offload).
Importing config, hf_config, scoring_plan, train_config, train_batches, rollout_batch, group or
hf_weights.{families,layouts} does not import Megatron."""
