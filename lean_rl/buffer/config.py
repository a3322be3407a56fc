"""Flags of the prompt data the buffer serves (the rollout side reads them through the buffer)."""

from __future__ import annotations

from dataclasses import dataclass

from lean_rl.buffer.images import check_multimodal_keys
from lean_rl.options import option


def _none_if_empty(value: str | None) -> str | None:
    return value or None


@dataclass(frozen=True)
class DataConfig:
    prompt_data: str | None = option(None, help="jsonl or parquet file of prompts")
    data_source_path: str | None = option(
        None, help="dotted path of `make_source(cfg)` returning the training prompts' source in place of the "
                   "--prompt-data reader: next() -> (epoch, PromptRecord) | None, state_dict(), load_state_dict(state)")
    input_key: str = option("prompt", help="column with the prompt: text or a list of chat messages")
    label_key: str | None = option("label", help="column with the reference answer ('' for none)",
                                   convert=_none_if_empty)
    metadata_key: str | None = option(None, help="column with a dict passed through to samples")
    tool_key: str | None = option(None, help="column with tool definitions for the chat template")
    apply_chat_template: bool = option(False, help="render prompts with the tokenizer's chat template")
    rollout_shuffle: bool = option(False, help="shuffle prompts every epoch (seeded by --seed)")
    seed: int = option(42)
    num_epochs: int | None = option(None, positive=True)  # None: as many as the run needs
    rollout_max_prompt_len: int | None = option(None, positive=True, help="skip (and count) longer prompts")
    skip_bad_rows: bool = option(False, help="skip and count malformed rows instead of failing")
    # preference pairs (--loss-type dpo_loss / rm_loss; lean_rl/rollout/preference.py): the prompt is --input-key's
    chosen_key: str = option("chosen", help="column with the preferred response (--loss-type dpo_loss / rm_loss)")
    rejected_key: str = option("rejected", help="column with the dispreferred response (--loss-type dpo_loss / "
                                                "rm_loss)")
    # image prompts (issue 44; lean_rl/buffer/images.py)
    multimodal_keys: str | None = option(
        None, convert=check_multimodal_keys,
        help="JSON {media type: column}, e.g. '{\"image\": \"images\"}' (slime's): the column's images (paths, "
             "file:// URLs or base64) go where the prompt's text says <image>; needs --apply-chat-template")

    @property
    def has_prompts(self) -> bool:
        """Whether the run has training prompts: a file, or a source of its own."""
        return bool(self.prompt_data or self.data_source_path)
