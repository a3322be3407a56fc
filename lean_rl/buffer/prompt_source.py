"""Prompt datasets: read jsonl/parquet rows, render and tokenize prompts, hand them out epoch by epoch."""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol, cast

from lean_rl.buffer.config import DataConfig
from lean_rl.buffer.images import ImageError, image_column, render_image_prompt, row_images


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path)


class BadRowError(ValueError):
    pass


@dataclass(frozen=True)
class PromptRecord:
    row: int  # 1-based line (jsonl) or row (parquet) in the file: stable identity of the prompt
    prompt: str | list[dict[str, Any]] | int | float | bool  # as in the file
    tokens: tuple[int, ...]  # the rendered prompt, tokenized; () for a scalar prompt (the generate function's)
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # --multimodal-keys: {"images": [the row's image references]}; `tokens` then hold the processor's
    # expansion (one image pad per vision token). None: a text prompt.
    multimodal_inputs: dict[str, Any] | None = None


PROMPT_FILE_TYPES = (".jsonl", ".json", ".parquet")


def check_prompt_file_type(path: str | Path) -> None:
    suffix = Path(path).suffix
    if suffix not in PROMPT_FILE_TYPES:
        raise ValueError(f"{path}: unsupported prompt file type {suffix or '(no extension)'!r} "
                         "(use .jsonl, one JSON object per line, or .parquet)")


def _iter_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(row number, row, error) for each row; error is set (and row None) for unparseable rows."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row, None
        return
    check_prompt_file_type(path)
    with path.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:  # the whole file is wrong, not this row: never skipped
                raise ValueError(f"{path}:{i}: not UTF-8 text (byte {raw[err.start:err.start + 1]!r} at column "
                                 f"{err.start + 1}); prompt files must be UTF-8 encoded") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                yield i, None, f"invalid JSON ({err.msg} at column {err.colno})"
                continue
            yield (i, row, None) if isinstance(row, dict) else (i, None, f"expected a JSON object, got {_json_type(row)}")


def _json_type(value) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _check_messages(prompt: list, key: str) -> None:
    for message in prompt:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str) and "content" in message):
            raise BadRowError(f"{key!r} must be text or a list of {{'role', 'content'}} messages")


def render_prompt(record_prompt, data: DataConfig, tokenizer, tools=None) -> list[int]:
    """The prompt's token ids as the built-in reader makes them (--apply-chat-template, tools): for a
    --data-source-path source building its PromptRecords."""
    if data.apply_chat_template:
        messages = record_prompt if isinstance(record_prompt, list) else [{"role": "user", "content": record_prompt}]
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    elif isinstance(record_prompt, list):
        raise BadRowError("the prompt is a list of messages: pass --apply-chat-template to render it")
    else:
        text = record_prompt
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_prompts(path: str | Path, data: DataConfig, tokenizer, flag: str = "--prompt-data",
                 user_generates: bool = False, processor=None) -> tuple[list[PromptRecord], collections.Counter]:
    """Every usable row of `path`, plus counters of what was skipped and why. Every error starts with
    `flag` (the option that named the file: --prompt-data, or --eval-prompt-data NAME). With
    `user_generates` (the run's generation is a user's function), a list of messages without
    --apply-chat-template is kept as it is, without tokens, for that function (slime's hand it over so).
    With --multimodal-keys, `processor` (the checkpoint's AutoProcessor) renders the rows with their images."""
    try:
        return _load_prompts(Path(path), data, tokenizer, user_generates, processor)
    except (OSError, ValueError) as err:
        try:
            named = type(err)(f"{flag}: {err}")
        except Exception:  # noqa: BLE001 - an exception type that takes other arguments
            named = ValueError(f"{flag}: {err}")
        raise named from None


def _load_prompts(path: Path, data: DataConfig, tokenizer, user_generates: bool = False, processor=None
                  ) -> tuple[list[PromptRecord], collections.Counter]:
    if not path.is_file():
        raise FileNotFoundError(f"prompt data file {str(path)!r} does not exist")
    images_key = image_column(data.multimodal_keys)
    if images_key and not data.apply_chat_template:
        raise ValueError("--multimodal-keys puts images into the chat: pass --apply-chat-template")
    if images_key and processor is None:
        raise ValueError("--multimodal-keys needs the checkpoint's processor (processor_config.json)")
    records, skipped = [], collections.Counter()
    for row_number, row, error in _iter_rows(path):
        try:
            if error:
                raise BadRowError(error)
            if data.input_key not in row:
                raise BadRowError(f"missing key {data.input_key!r} (--input-key); keys: {sorted(row)}")
            prompt = row[data.input_key]
            if isinstance(prompt, list):
                _check_messages(prompt, data.input_key)
            elif isinstance(prompt, (dict, type(None))):
                raise BadRowError(f"{data.input_key!r} must be text, a list of messages or a scalar value, got "
                                  f"{_json_type(prompt)}")
            if data.label_key and data.label_key not in row:
                raise BadRowError(f"missing key {data.label_key!r} (--label-key)")
            metadata = row.get(data.metadata_key) if data.metadata_key else None
            if metadata is not None and not isinstance(metadata, dict):
                raise BadRowError(f"{data.metadata_key!r} (--metadata-key) must be an object, got "
                                  f"{_json_type(metadata)}")
            tools = row.get(data.tool_key) if data.tool_key else None
            images = row_images(cast(dict, row), images_key) if images_key else None
            if images is not None:
                if not isinstance(prompt, (str, list)):
                    raise BadRowError(f"{data.input_key!r} must be text or messages to hold images")
                tokens = render_image_prompt(prompt, images, cast(str, images_key), processor, tools)
            # a scalar (tau-bench's task index): kept as it is for the generate function, as slime does; no tokens
            elif isinstance(prompt, str) or (isinstance(prompt, list)
                                             and (data.apply_chat_template or not user_generates)):
                tokens = render_prompt(prompt, data, tokenizer, tools)
            else:
                tokens = []
        except (BadRowError, ImageError) as err:
            if not data.skip_bad_rows:
                raise BadRowError(f"{path}:{row_number}: {err} (pass --skip-bad-rows to skip such rows)") from None
            skipped["bad_row"] += 1
            continue
        if data.rollout_max_prompt_len and len(tokens) > data.rollout_max_prompt_len:
            skipped["prompt_too_long"] += 1
            continue
        label = row.get(data.label_key) if data.label_key else None
        records.append(PromptRecord(row_number, prompt, tuple(tokens), label, dict(metadata or {}),
                                    None if images is None else {"images": list(images)}))
    if not records:
        raise ValueError(f"{path}: no usable prompts (skipped: {dict(skipped) or 'none'}"
                         f"{'' if skipped else '; the file has no rows'})")
    return records, skipped


class PromptSourceLike(Protocol):
    """What the DataBuffer needs of a prompt source: the built-in PromptSource below, or the object a
    --data-source-path factory returns (buffer/user_source.py checks it)."""

    def next(self) -> tuple[int, PromptRecord] | None:
        """(epoch, record) of the next prompt, or None once the data is used up."""

    def state_dict(self) -> dict[str, Any]:
        """The cursor, JSON-serialisable: saved with every checkpoint (inside the buffer's state)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict() (on resume, before the first next())."""


class PromptSource:
    """Hands out prompt records in (optionally shuffled) epochs; its cursor is part of the checkpoint."""

    def __init__(self, records: list[PromptRecord], shuffle: bool = False, seed: int = 0, num_epochs: int | None = None):
        if not records:
            raise ValueError("PromptSource needs at least one prompt")
        self.records = records
        self.shuffle, self.seed, self.num_epochs = shuffle, seed, num_epochs
        self.epoch, self.position = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> tuple[int, PromptRecord] | None:
        """(epoch, record), or None once every epoch is used up."""
        if self.position == len(self._order):
            if self.num_epochs is not None and self.epoch + 1 >= self.num_epochs:
                return None
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        record = self.records[self._order[self.position]]
        self.position += 1
        return self.epoch, record

    @functools.cached_property
    def fingerprint(self) -> str:
        """What decides which prompt comes next: every record (row, tokenized prompt, label) and the
        order (shuffle, seed). A resume with another file, other keys, another chat template or
        tokenizer, or another seed would hand out other prompts under the same cursor."""
        digest = hashlib.sha256(f"shuffle={self.shuffle} seed={self.seed}\n".encode())
        for record in self.records:
            digest.update(json.dumps([record.row, record.tokens, record.label], default=str).encode())
            if record.multimodal_inputs is not None:  # (text prompts keep their older checkpoints' fingerprint)
                digest.update(json.dumps(record.multimodal_inputs).encode())
        return digest.hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "num_records": len(self.records),
                "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_records"] != len(self.records):
            raise ValueError(
                f"the prompt data has {len(self.records)} usable rows but the checkpoint was taken with "
                f"{state['num_records']}: resuming would hand out the wrong prompts"
            )
        if state.get("fingerprint", self.fingerprint) != self.fingerprint:  # absent in older checkpoints
            raise ValueError(
                "the prompt data differs from the run that saved the checkpoint (same number of rows, but other "
                "prompts, labels, tokenization or order: check --prompt-data, --input-key, --label-key, "
                "--apply-chat-template, the tokenizer, --seed, --rollout-shuffle): resuming would hand out the "
                "wrong prompts")
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._epoch_order(self.epoch)
