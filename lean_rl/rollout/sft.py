"""The rollout of supervised fine-tuning (--loss-type sft_loss, slime's SFT stage): no engines, no
generation; each prompt of --prompt-data is a conversation (a list of {role, content} messages with
assistant turns), rendered with the tokenizer's chat template into one sample whose trained tokens
(loss mask 1) are the assistant turns' and nothing else. The trainer's sft_loss takes their negative
log-likelihood (lean_rl/algorithms/losses.py).

    python -m lean_rl.train --loss-type sft_loss --prompt-data chats.jsonl --input-key messages \
        --apply-chat-template --n-samples-per-prompt 1 ...

The conversation is rendered one message at a time: each message's text is what the template adds
to the conversation before it, and an assistant message's header (the template's generation prompt)
is not trained. A template that rewrites earlier turns when a later one is added (so that a rendering
is not a prefix of the next) is refused with the row named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import RolloutOutput
from lean_rl.sample import NOT_GENERATED, Sample, Status

if TYPE_CHECKING:
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config


def _render(tokenizer, messages: list[dict[str, Any]], tools, generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def conversation_tokens(tokenizer, messages: list[dict[str, Any]], tools=None) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a whole conversation: mask 1 on the assistant messages' tokens."""
    text, tokens, mask = "", [], []

    def extend(rendered: str, trained: int) -> None:
        nonlocal text
        if not rendered.startswith(text):
            raise ValueError("the chat template renders an earlier turn differently once a later one is added; "
                             "SFT needs each rendering to extend the one before")
        new = tokenizer(rendered[len(text):], add_special_tokens=False)["input_ids"]
        tokens.extend(new)
        mask.extend([trained] * len(new))
        text = rendered

    for k, message in enumerate(messages):
        if message.get("role") == "assistant":
            extend(_render(tokenizer, messages[:k], tools, generation_prompt=True), 0)  # the assistant header
            extend(_render(tokenizer, messages[:k + 1], tools, generation_prompt=False), 1)
        else:
            extend(_render(tokenizer, messages[:k + 1], tools, generation_prompt=False), 0)
    if 1 not in mask:
        raise ValueError("the conversation has no assistant message to train on")
    return tokens, mask


def fill_sample(sample: Sample, tokens: list[int], mask: list[int]) -> Sample:
    """`sample` as one trained conversation: the prompt up to the first trained token, the rest as the
    response (no policy generated it: versions NOT_GENERATED, log-probs 0)."""
    start = mask.index(1)
    sample.tokens = list(tokens)
    sample.response_length = len(tokens) - start
    sample.loss_mask = list(mask[start:])
    sample.rollout_log_probs = [0.0] * sample.response_length
    sample.weight_versions = [NOT_GENERATED] * sample.response_length
    sample.reward = 0.0
    sample.status = Status.COMPLETED
    sample.check()
    return sample


async def generate_rollout(cfg: Config, rollout_id: int, buffer: DataBuffer | None,
                           evaluation: bool = False) -> RolloutOutput:
    if evaluation or buffer is None:
        raise ValueError("--loss-type sft_loss: the SFT rollout trains on --prompt-data; it does not evaluate")
    tokenizer = load_tokenizer(cfg.engines.model_path)
    groups = buffer.get_prompt_groups(cfg.rollout.rollout_batch_size)
    if len(groups) < cfg.rollout.rollout_batch_size:
        raise ValueError(f"--prompt-data {cfg.data.prompt_data}: the data ran out at rollout {rollout_id} "
                         f"(--num-epochs {cfg.data.num_epochs}); lower --num-rollout")
    trained = 0
    for group in groups:
        for sample in group:
            if not isinstance(sample.prompt, list):
                raise ValueError(f"--prompt-data row {sample.metadata.get('prompt_row')}: --loss-type sft_loss needs a "
                                 f"conversation (a list of messages) under --input-key {cfg.data.input_key}")
            try:
                tokens, mask = conversation_tokens(tokenizer, sample.prompt, sample.metadata.get("tools"))
            except ValueError as err:
                raise ValueError(f"--prompt-data row {sample.metadata.get('prompt_row')}: {err}") from None
            fill_sample(sample, tokens, mask)
            trained += sum(mask)
    buffer.put_finished_groups(groups)
    return RolloutOutput(metrics={"rollout/sft_trained_tokens": float(trained)})
