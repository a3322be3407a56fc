"""Sample groups -> the tensors the trainer needs (pure; driver side): per-token values are [B, T],
response-aligned (row i holds sequence i's response tokens from column 0, zero-padded to the longest
response), the form the advantages take them in and train_batches.build_micro_batch lays out.

A FAILED sample (its generation or reward failed: an engine, the router or the reward function, not
the policy) is not data: `valid` is False for it, so the advantage estimators leave it out of its
group's statistics (lean_rl/algorithms/advantages.py), and its tokens get loss weight 0, so it counts
in no loss denominator. `check_failed_fraction` refuses a batch where too many failed. Within a
sample, `loss_mask` (0 on tool / environment tokens) decides which response tokens are trained."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lean_rl import routed_experts
from lean_rl.backends.megatron.train_batches import Sequence
from lean_rl.sample import NOT_GENERATED, REMAX_BASELINE_REWARD, Sample, Status


@dataclass(frozen=True)
class RolloutBatch:
    sequences: list[Sequence]
    rewards: torch.Tensor  # [B] float32
    group_ids: torch.Tensor  # [B] int64
    masks: torch.Tensor  # [B, T] float32: 1 = trained token (0 on padding)
    rollout_log_probs: torch.Tensor  # [B, T] float32 (0 where not generated)
    weight_versions: list[torch.Tensor]  # [R_i] int64 (NOT_GENERATED for tool tokens)
    valid: torch.Tensor  # [B] bool: False for a FAILED sample
    failures: tuple[str, ...]  # why each FAILED sample failed, in batch order ("sample 3 (group 0) reward_error: ...")
    # [B] float32: metadata[REMAX_BASELINE_REWARD] (the prompt's greedy-response reward, remax), NaN where absent
    baseline_rewards: torch.Tensor | None = None
    # [B, T] float32: sample.teacher_log_probs (--use-opd), 0 where a sample has none
    teacher_log_probs: torch.Tensor | None = None
    # [B] float32: sample.loss_weight (its share of its trajectory in the loss aggregation)
    loss_weights: torch.Tensor | None = None
    # [B, T, K] int64 / float32: sample.teacher_top_ids / teacher_top_log_probs (--opd-estimator topk);
    # None when no sample has them, 0 in the rows of those that have none
    teacher_top_ids: torch.Tensor | None = None
    teacher_top_log_probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def failed(self) -> int:
        return len(self) - int(self.valid.sum())

    @property
    def failed_fraction(self) -> float:
        return self.failed / max(1, len(self))

    @property
    def response_lengths(self) -> list[int]:
        return [s.response_length for s in self.sequences]

    @property
    def lengths(self) -> list[int]:
        return [len(s.tokens) for s in self.sequences]


def rollout_batch(groups: list[list[Sample]]) -> RolloutBatch:
    samples = [sample for group in groups for sample in group]
    if not samples:
        raise ValueError("train() got no samples")
    sequences, rewards, group_ids, masks, log_probs, versions, valid, failures = [], [], [], [], [], [], [], []
    baselines, teacher, loss_weights = [], [], []
    for group in groups:
        if not group:
            raise ValueError("train() got an empty group")
        for sample in group:
            sample.check()
            if sample.group_index != group[0].group_index:
                raise ValueError(f"sample {sample.index} has group_index {sample.group_index} inside group "
                                 f"{group[0].group_index}")
            if sample.prompt_length < 1:
                raise ValueError(f"sample {sample.index} has no prompt token (the first token has no context)")
            is_failed = sample.status == Status.FAILED
            if is_failed:
                failures.append(f"sample {sample.index} (group {sample.group_index}) {failure_reason(sample)}")
            if sample.reward is None and not is_failed:
                raise ValueError(f"sample {sample.index} ({sample.status.value}) has no reward; score it before training")
            reward = 0.0 if sample.reward is None else float(sample.reward)
            mask = torch.tensor(sample.loss_mask, dtype=torch.float32)
            sequences.append(Sequence(tokens=tuple(sample.tokens), prompt_length=sample.prompt_length,
                                      routed_experts=_routes(sample), images=sample.multimodal_train_inputs))
            rewards.append(reward)
            baseline = sample.metadata.get(REMAX_BASELINE_REWARD)
            baselines.append(math.nan if baseline is None else float(baseline))
            group_ids.append(sample.group_index)
            masks.append(torch.zeros_like(mask) if is_failed else mask)
            valid.append(not is_failed)
            log_probs.append(torch.tensor(sample.rollout_log_probs, dtype=torch.float32))
            teacher.append(torch.tensor(sample.teacher_log_probs, dtype=torch.float32))
            versions.append(torch.tensor(sample.weight_versions, dtype=torch.long))
            loss_weights.append(float(sample.loss_weight))
    masks = pad(masks)
    top_ids, top_log_probs = _teacher_top(samples, max(1, max(s.response_length for s in samples)))
    return RolloutBatch(sequences=sequences, rewards=torch.tensor(rewards, dtype=torch.float32),
                        group_ids=torch.tensor(group_ids, dtype=torch.long), masks=masks,
                        rollout_log_probs=pad(log_probs, masks.shape[1]), weight_versions=versions,
                        valid=torch.tensor(valid, dtype=torch.bool), failures=tuple(failures),
                        baseline_rewards=torch.tensor(baselines, dtype=torch.float32),
                        teacher_log_probs=pad(teacher, masks.shape[1]),
                        loss_weights=torch.tensor(loss_weights, dtype=torch.float32),
                        teacher_top_ids=top_ids, teacher_top_log_probs=top_log_probs)


def _teacher_top(samples: list[Sample], length: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    widths = {len(row) for s in samples for row in s.teacher_top_ids}
    if not widths:
        return None, None
    if len(widths) > 1:
        raise ValueError(f"the teacher's top-k rows have different widths {sorted(widths)} in one batch")
    (k,) = widths
    ids = torch.zeros(len(samples), length, k, dtype=torch.long)
    log_probs = torch.zeros(len(samples), length, k)
    for i, sample in enumerate(samples):
        if sample.teacher_top_ids:
            ids[i, :sample.response_length] = torch.tensor(sample.teacher_top_ids, dtype=torch.long)
            log_probs[i, :sample.response_length] = torch.tensor(sample.teacher_top_log_probs, dtype=torch.float32)
    return ids, log_probs


def _routes(sample: Sample):
    """The engine's routes of the sample's tokens[:-1] (--use-rollout-routing-replay), decoded; None if absent."""
    if sample.routed_experts is None:
        return None
    return routed_experts.decode(sample.routed_experts, len(sample.tokens) - 1)


# set by rollout/default.py, rollout/rewards.py and rollout/distillation.py (--use-opd)
FAILURE_KEYS = ("generate_error", "reward_error", "teacher_error")
SHOWN_FAILURES = 3
REASON_CHARS = 300


def failure_reason(sample: Sample) -> str:
    """The error a FAILED sample carries in its metadata (the first of FAILURE_KEYS, else any `*error`)."""
    keys = [k for k in FAILURE_KEYS if k in sample.metadata]
    keys += [k for k in sample.metadata if k.endswith("error") and k not in keys]
    if not keys:
        return "(no *_error in sample.metadata)"
    return f"{keys[0]}: {str(sample.metadata[keys[0]])[:REASON_CHARS]}"


class FailedSamplesError(RuntimeError):
    """More of a rollout's samples FAILED than --max-failed-fraction allows."""


def check_failed_fraction(batch: RolloutBatch, max_failed_fraction: float) -> None:
    """Raise FailedSamplesError when more than `max_failed_fraction` of the batch FAILED: the engines,
    the router or the reward function are broken, and what is left is too little (and too selected)
    to train on."""
    if batch.failed_fraction <= max_failed_fraction:
        return
    shown = "; ".join(batch.failures[:SHOWN_FAILURES])
    more = f" (and {batch.failed - SHOWN_FAILURES} more)" if batch.failed > SHOWN_FAILURES else ""
    raise FailedSamplesError(
        f"{batch.failed} of {len(batch)} samples of this rollout FAILED ({batch.failed_fraction:.0%}), more than "
        f"--max-failed-fraction {max_failed_fraction} allows; stopping before training on it. First failures: "
        f"{shown}{more}. Fix the engines, router or reward function these errors point at, or raise "
        f"--max-failed-fraction to train on the samples that did not fail.")


def pad(values: list[torch.Tensor], length: int | None = None) -> torch.Tensor:
    """[B, T] (right-padded with 0) from B response-aligned vectors."""
    length = max((v.numel() for v in values), default=0) if length is None else length
    out = torch.zeros(len(values), max(length, 1), dtype=values[0].dtype if values else torch.float32)
    for i, v in enumerate(values):
        out[i, : v.numel()] = v
    return out


def batch_metrics(batch: RolloutBatch, policy_version: int) -> dict[str, float]:
    """What the trainer saw in the batch. The rollout's own metrics (rollout/reward_mean, lengths, ...)
    come from rollout.default.rollout_metrics; train/reward_mean is the reward as trained: the mean over
    the samples that did not FAIL (FAILED samples are counted by rollout/failed_samples and
    rollout/failed_frac, and trained on not at all)."""
    versions = torch.cat(batch.weight_versions) if batch.weight_versions else torch.zeros(0, dtype=torch.long)
    generated = versions != NOT_GENERATED
    stale = (versions < policy_version) & generated
    trained_rewards = batch.rewards[batch.valid]
    return {
        "train/reward_mean": float(trained_rewards.sum()) / max(1, trained_rewards.numel()),
        "rollout/trained_tokens": float(batch.masks.sum()),
        "rollout/failed_samples": float(batch.failed),
        "rollout/failed_frac": batch.failed_fraction,
        # a NaN reward is trained as it is: the non-finite step guard skips and counts the step
        "rollout/nonfinite_rewards": float((~torch.isfinite(trained_rewards)).sum()),
        "rollout/stale_token_frac": float(stale.sum()) / max(1, int(generated.sum())),
        "rollout/max_staleness": float((policy_version - versions[stale]).max()) if bool(stale.any()) else 0.0,
    }

