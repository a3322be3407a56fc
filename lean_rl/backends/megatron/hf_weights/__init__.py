"""HF <-> Megatron weights: per-family tables (families.py), the TP shard math (layouts.py), loading
an HF checkpoint into a model at any TP/PP/EP layout (load.py) and gathering HF-named tensors back
(export.py). families.py and layouts.py are pure torch; load/export need an initialised Megatron."""
