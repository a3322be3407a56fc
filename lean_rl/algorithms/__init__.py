"""RL algorithm math as plain torch functions over padded [batch, time] tensors with masks: advantage
estimators (advantages.py), KL estimators (kl.py), policy / value losses, off-policy weights and loss
aggregation (losses.py), and their typed flags (config.py). Nothing here imports Megatron; the trainer
(lean_rl/backends/megatron/) calls these on each rank and on the driver."""
