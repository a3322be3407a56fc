"""slime.utils.processing_utils: the tokenizer of a checkpoint (text models: no processor)."""

from __future__ import annotations

from lean_rl.buffer.prompt_source import load_tokenizer as _cached_tokenizer


def load_tokenizer(name_or_path: str, **kwargs):
    """The checkpoint's tokenizer: the one the run itself uses (cached), so token ids agree."""
    return _cached_tokenizer(name_or_path)


def load_processor(name_or_path: str, **kwargs):
    """None: lean_rl serves text models (slime returns None for those too)."""
    return None
