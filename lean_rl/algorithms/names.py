"""The names the algorithm flags choose from (--advantage-estimator, --kl-loss-type, --policy-loss, ...),
apart from the torch code that implements them, so that the config layer imports no torch."""

from __future__ import annotations

ESTIMATORS = ("grpo", "dr_grpo", "gspo", "cispo", "rloo", "opo", "remax", "pass_at_k", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline", "ppo")
KL_IN_REWARD_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
# the estimators whose group baseline --disable-rewards-normalization removes (slime's set, with dr_grpo)
RAW_REWARD_ESTIMATORS = ("grpo", "dr_grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
IS_LEVELS = ("token", "sequence", "geometric")
POLICY_LOSSES = ("ppo", "gspo", "cispo", "gmpo", "kl_cov", "clip_cov", "sapo")
# --loss-type (slime's names): the PPO-family policy loss, supervised fine-tuning, or --custom-loss-function-path;
# and lean_rl's losses on preference pairs: DPO on the policy, Bradley-Terry on a reward model's value head
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss", "dpo_loss", "rm_loss")
PAIRWISE_LOSS_TYPES = ("dpo_loss", "rm_loss")
# the loss types that train on given data with no engines (rollout/sft.py, rollout/preference.py)
ENGINELESS_LOSS_TYPES = ("sft_loss", *PAIRWISE_LOSS_TYPES)
# --loss-type dpo_loss: --dpo-loss-type (algorithms/preference.py)
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "sigmoid_norm")
