"""Checkpoint conversion between HF safetensors and Megatron torch_dist (`python -m lean_rl.convert`):
hf_to_megatron.convert_hf_to_megatron, megatron_to_hf.convert_megatron_to_hf. Both stream (memory near
one shard plus the largest tensor), check their input before writing, and publish their output only
when complete. Pure torch + safetensors: Megatron is not imported."""
