"""The rollout of training on preference pairs (--loss-type dpo_loss / rm_loss): no engines, no
generation; each row of --prompt-data holds a prompt (--input-key, text or messages, rendered as every
prompt is) and two responses, the preferred one (--chosen-key) and the other (--rejected-key), as text
or as token ids (a policy's own samples: buffer/preference_pairs.py). Each row becomes a group of two
samples, the chosen one first with reward 1 and the rejected one with reward 0
(lean_rl/algorithms/preference.py pairs them by that mark).

    python -m lean_rl.train --loss-type dpo_loss --prompt-data pairs.jsonl --input-key prompt \
        --chosen-key chosen --rejected-key rejected --n-samples-per-prompt 2 --dpo-beta 0.1 ...

DPO (dpo_loss): the response's tokens (with the tokenizer's EOS appended) are the trained tokens.
Reward model (rm_loss): the model scores prompt + response at its last token, as HF's
*ForSequenceClassification and SGLang's reward models do; the sample's one trained "response" token is a
placeholder after the text, so that the value laid out at its prediction position is the last real
token's (train_batches.py lays a field at the position before its token)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lean_rl.buffer.preference_pairs import Response, read_pairs
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.rollout.base import RolloutOutput
from lean_rl.sample import NOT_GENERATED, Sample, Status

if TYPE_CHECKING:
    from lean_rl.buffer.data_buffer import DataBuffer
    from lean_rl.config import Config

CHOSEN, REJECTED = 1.0, 0.0  # the rewards that mark a pair's samples (algorithms/preference.pair_rows)


def response_tokens(tokenizer, text: Response, eos: bool) -> list[int]:
    """The response's token ids: text tokenized, or token ids (a policy's own sample) as they are."""
    ids = list(text) if isinstance(text, list) else tokenizer(text, add_special_tokens=False)["input_ids"]
    if isinstance(text, list) and max(ids) >= len(tokenizer):
        raise ValueError(f"--prompt-data: a response's token id {max(ids)} is past the tokenizer's {len(tokenizer)} "
                         "tokens (token ids from another model?)")
    if eos and tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    return ids


def fill_pair_sample(sample: Sample, prompt_tokens: list[int], response: list[int], mark: float,
                     score_only: bool, placeholder: int) -> Sample:
    """`sample` as one side of a pair. score_only (reward model): prompt + response is the "prompt" and
    one placeholder token is the trained response, whose prediction position is the text's last token."""
    if score_only:
        sample.tokens = [*prompt_tokens, *response, placeholder]
        sample.response_length = 1
    else:
        sample.tokens = [*prompt_tokens, *response]
        sample.response_length = len(response)
    sample.loss_mask = [1] * sample.response_length
    sample.rollout_log_probs = [0.0] * sample.response_length
    sample.weight_versions = [NOT_GENERATED] * sample.response_length
    sample.reward = mark
    sample.status = Status.COMPLETED
    sample.check()
    return sample


async def generate_rollout(cfg: Config, rollout_id: int, buffer: DataBuffer | None,
                           evaluation: bool = False) -> RolloutOutput:
    loss_type = cfg.algorithm.loss_type
    if evaluation or buffer is None:
        raise ValueError(f"--loss-type {loss_type}: the preference rollout trains on --prompt-data; it does not evaluate")
    data = cfg.data
    if data.prompt_data is None:
        raise ValueError(f"--loss-type {loss_type} reads its pairs from --prompt-data")
    pairs = read_pairs(data.prompt_data, data.chosen_key, data.rejected_key)
    tokenizer = load_tokenizer(cfg.engines.model_path)
    groups = buffer.get_prompt_groups(cfg.rollout.rollout_batch_size)
    if len(groups) < cfg.rollout.rollout_batch_size:
        raise ValueError(f"--prompt-data {data.prompt_data}: the data ran out at rollout {rollout_id} "
                         f"(--num-epochs {data.num_epochs}); lower --num-rollout")
    score_only = loss_type == "rm_loss"
    placeholder = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    trained = 0
    for group in groups:
        if len(group) != 2:
            raise ValueError(f"--loss-type {loss_type}: each pair is a group of two samples: --n-samples-per-prompt 2")
        row: Any = group[0].metadata.get("prompt_row")
        chosen, rejected = pairs[row]
        prompt_tokens = list(group[0].tokens[:group[0].prompt_length])
        for sample, text, mark in ((group[0], chosen, CHOSEN), (group[1], rejected, REJECTED)):
            sample.response = text if isinstance(text, str) else tokenizer.decode(text)
            fill_pair_sample(sample, prompt_tokens, response_tokens(tokenizer, text, eos=not score_only), mark,
                             score_only, placeholder)
            trained += sample.response_length
    buffer.put_finished_groups(groups)
    return RolloutOutput(metrics={"rollout/pairs": float(len(groups)), "rollout/pair_trained_tokens": float(trained)})
