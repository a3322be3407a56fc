"""A server the unmodified `tinker` SDK (0.38) drives: python -m lean_rl.serve_tinker (docs/tinker.md)."""
