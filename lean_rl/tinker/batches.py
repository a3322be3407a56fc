"""Tinker datums -> the trainer's micro-batches (rank side: backends/megatron/tinker_rank.py).

A datum is its input tokens [N] and its loss inputs [N] each; position i predicts target_tokens[i]
(arbitrary targets: not assumed to be the inputs shifted). Every micro-batch has the same shape
[rows, L] (L the longest datum; pipeline stages exchange fixed shapes), padding masked out."""

from __future__ import annotations

import numpy as np

from lean_rl.tinker.futures import UserError
from lean_rl.tinker.wire import Datum


def build_micro_batches(data: list[Datum], rows: int, vocab_size: int) -> list[dict[str, np.ndarray]]:
    names = set(data[0].inputs)
    for index, datum in enumerate(data):
        if set(datum.inputs) != names:
            raise UserError(f"data[{index}].loss_fn_inputs has {sorted(datum.inputs)}, data[0] has {sorted(names)}")
    if "target_tokens" not in names:
        raise UserError("loss_fn_inputs lacks target_tokens")
    width = max(d.tokens.shape[0] for d in data)
    batches = []
    for start in range(0, len(data), rows):
        chunk = data[start:start + rows]
        mb = {"tokens": np.zeros((rows, width), np.int64), "targets": np.zeros((rows, width), np.int64),
              "mask": np.zeros((rows, width), np.float32)}
        for name in names - {"target_tokens"}:
            mb[name] = np.zeros((rows, width), np.float32)
        for row, datum in enumerate(chunk):
            n = datum.tokens.shape[0]
            targets = datum.inputs["target_tokens"].astype(np.int64)
            bad = (targets < 0) | (targets >= vocab_size)
            if bad.any():
                raise UserError(f"data[{start + row}].loss_fn_inputs['target_tokens'] holds {int(targets[bad][0])}, "
                                f"outside the vocabulary [0, {vocab_size})")
            mb["tokens"][row, :n] = datum.tokens
            mb["targets"][row, :n] = targets
            mb["mask"][row, :n] = 1.0
            for name in names - {"target_tokens"}:
                mb[name][row, :n] = datum.inputs[name]
        batches.append(mb)
    return batches


def per_datum_logprobs(batches: list[np.ndarray], data: list[Datum], rows: int) -> list[np.ndarray]:
    """The [rows, L] log-probs per micro-batch back to one [N] array per datum."""
    out = []
    for index, datum in enumerate(data):
        out.append(np.asarray(batches[index // rows][index % rows, :datum.tokens.shape[0]], dtype=np.float32))
    return out
