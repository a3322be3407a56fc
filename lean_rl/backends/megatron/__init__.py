"""Megatron-core trainer side. Driver-side entry point: group.MegatronGroup (the policy or PPO's
critic, one Ray actor per rank: rank.MegatronRank, reached through MegatronGroup.call_all /
call_each). Configuration: config (typed flags), hf_config (from HF config.json). Rank-side: compat
(CPU/gloo/no-TE fixes), distributed, model, logprobs, scoring; HF weights in hf_weights/. Training:
train_config (flags), rollout_batch + train_batches (groups -> per-DP micro-batches, pure),
train_driver (driver side: initialize_for_training, train_on_rollout), rank_trainer (rank side:
RankTrainer.train_step (the training pass; forward_only for scoring), optimizer_setup, reference, value_head, checkpoint,
offload). Importing config, hf_config, scoring_plan, train_config, train_batches, rollout_batch, group
or hf_weights.{families,layouts} does not import Megatron."""

import warnings

# Megatron warns at import about every optional accelerator library it did not find (TE, Apex, ...):
# nothing actionable on CPU, and it buries one-line errors of scripts that import the trainer before
# parsing their flags. Filtered here, before any module of this package imports megatron.core.
warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
