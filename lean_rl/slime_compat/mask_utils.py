"""slime.utils.mask_utils: which tokens of a finished chat the policy is trained on.

    MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen").get_loss_mask(messages, tools=None)
        -> (token_ids, loss_mask)

For chats produced outside lean_rl's /generate (slime's rollout-buffer server keeps OpenAI-style
`messages`): the token ids are the chat as the tokenizer's template renders it, and the mask holds 1
on what each assistant message generated and 0 on the rest. By `tokenizer_type`:

- "qwen", "qwen3", "qwen3_5": the whole chat rendered once. An assistant message's trained span runs
  from the end of the generation prompt before it (its header is never trained) to the end of its
  own rendering (its end-of-turn marker included). The span is found by rendering the chat's prefixes,
  so the template must render each prefix as the start of the whole chat; one that rewrites earlier
  turns (Qwen3's dropping of earlier thinking) is refused naming the message.
- "distill_qwen" (and "qwen" with a DeepSeek-R1-distill tokenizer, which has `<｜Assistant｜>`): the
  first message rendered with the generation prompt, followed by the last message's content tokenized
  on its own (no end-of-turn): 1 on all of that content. Messages in between are left out, as slime does.

A message whose `step_loss_mask` is not 1 is not trained."""

from __future__ import annotations

from typing import Any

__all__ = ["MultiTurnLossMaskGenerator", "get_response_lengths"]

TOKENIZER_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")
DISTILL_ASSISTANT_TOKEN = "<｜Assistant｜>"  # in the added vocabulary of DeepSeek-R1-Distill tokenizers


def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
    """Per mask: its length from the first trained token to its end (0 when nothing is trained)."""
    return [len(mask) - mask.index(1) if 1 in mask else 0 for mask in loss_masks]


class MultiTurnLossMaskGenerator:
    def __init__(self, tokenizer: Any, tokenizer_type: str = "qwen"):
        if tokenizer_type not in TOKENIZER_TYPES:
            raise ValueError(f"--loss-mask-type {tokenizer_type!r} is not supported; choose one of "
                             f"{', '.join(TOKENIZER_TYPES)}")
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        return get_response_lengths(loss_masks)

    def get_loss_mask(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        if not messages:
            raise ValueError("get_loss_mask: messages is empty")
        distill = self.tokenizer_type == "distill_qwen" or (
            self.tokenizer_type == "qwen" and DISTILL_ASSISTANT_TOKEN in self.tokenizer.get_added_vocab())
        return self._distill_mask(messages, tools) if distill else self._template_mask(messages, tools)

    def get_text_from_loss_mask(self, token_ids: list[int], loss_masks: list[int]) -> list[str]:
        """The decoded text of each run of trained tokens, in order."""
        runs: list[list[int]] = []
        previous = 0
        for token, trained in zip(token_ids, loss_masks, strict=True):
            if trained == 1:
                if previous != 1:
                    runs.append([])
                runs[-1].append(token)
            previous = trained
        return [self.tokenizer.decode(run) for run in runs]

    def _render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _trained_spans(self, messages: list[dict], tools: list[dict] | None, text: str) -> list[tuple[int, int]]:
        """Character spans of `text` (the whole chat) that assistant messages generated."""
        spans = []
        for k, message in enumerate(messages):
            if message.get("role") != "assistant" or message.get("step_loss_mask", 1) != 1:
                continue
            if k == 0:
                raise ValueError("get_loss_mask: messages[0] is an assistant message; a chat starts with a "
                                 "system or user message (the generation prompt before it is unknown)")
            head = self._render(messages[:k], tools, generation_prompt=True)
            upto = self._render(messages[:k + 1], tools, generation_prompt=False)
            if not text.startswith(upto):
                raise ValueError(
                    f"get_loss_mask ({self.tokenizer_type}): the chat template does not render messages[:{k + 1}] "
                    f"as the start of the whole chat (it rewrites earlier turns), so the tokens of assistant "
                    f"message {k} cannot be told apart")
            if not (text.startswith(head) and len(head) <= len(upto)):
                raise ValueError(
                    f"get_loss_mask ({self.tokenizer_type}): assistant message {k} does not follow the template's "
                    f"generation prompt {head[len(self._render(messages[:k], tools, False)):]!r} (a template "
                    f"of another family: try another --loss-mask-type)")
            spans.append((len(head), len(upto)))
        return spans

    def _template_mask(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list[int]]:
        text = self._render(messages, tools, generation_prompt=False)
        spans = self._trained_spans(messages, tools, text)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"get_loss_mask ({self.tokenizer_type}): needs a fast tokenizer (character offsets)")
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        # a token counts as trained when any of its characters was generated (one that straddles the
        # header's end holds generated text)
        mask = [int(any(start < span_end and span_start < end for span_start, span_end in spans))
                for start, end in encoded["offset_mapping"]]
        return list(encoded["input_ids"]), mask

    def _distill_mask(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list[int]]:
        prompt = self._render(messages[:1], tools, generation_prompt=True)
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = self.tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        trained = 1 if messages[-1].get("step_loss_mask", 1) == 1 else 0
        return list(prompt_ids) + list(response_ids), [0] * len(prompt_ids) + [trained] * len(response_ids)
