"""Weight sync from the Megatron trainer to the SGLang engines (sync.py has the overview: WeightSync;
config.py: WeightSyncConfig, the flags). The package imports nothing on its own, so that the config
layer (lean_rl.config) can read weight_sync.config without torch."""
