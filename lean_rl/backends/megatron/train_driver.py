"""Driver side of training, on one or two MegatronGroups (the policy, and PPO's critic): a rollout
(sample groups) -> forward passes for old / reference log-probs and critic values -> advantages ->
optimizer steps, each split into per-DP-rank micro-batches that the ranks train on
(RankTrainer.train_step, rank_trainer.py). The math is in lean_rl/algorithms, the micro-batch layout in
train_batches.py. Every per-token tensor stays [B, T] response-aligned (rollout_batch.py) until
build_micro_batch lays it out for a rank.

Old log-probs are recomputed only when they can differ from the current policy's at the step that
uses them: with several optimizer steps per rollout (steps 2.. see an updated policy), decoupled PPO
(the proximal policy), or KL in the reward (needed before training). Otherwise the loss uses the
current log-probs detached, which are exactly the old ones on the first step.

FAILED samples are no training data (rollout_batch.py): a rollout where more than
--max-failed-fraction of them failed stops the run before any forward pass or optimizer step."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.distillation import reverse_kl_advantages
from lean_rl.algorithms.advantages import AdvantageInputs
from lean_rl.algorithms.hooks import compute_custom_or_builtin_advantages
from lean_rl.algorithms.kl import kl_estimate
from lean_rl.algorithms.losses import aggregation_weights
from lean_rl.algorithms.names import PAIRWISE_LOSS_TYPES
from lean_rl.algorithms.preference import pairwise_advantages
from lean_rl.backends.megatron.rank_trainer import RankTrainer
from lean_rl.backends.megatron.rollout_batch import RolloutBatch, batch_metrics, check_failed_fraction, rollout_batch
from lean_rl.backends.megatron.train_batches import (OPD_WEIGHTS, build_micro_batch, plan_micro_batches,
                                                     response_values, uniform_shapes)
from lean_rl.backends.megatron.train_options import Distillation, TrainOptions
from lean_rl.sample import Sample, Status

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronGroup


logger = logging.getLogger(__name__)

class NonFiniteStepsError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def _length_multiple(group: "MegatronGroup") -> int:
    par = group.config.parallel
    return par.tensor_model_parallel_size if par.sequence_parallel else 1


def _needs_uniform_shapes(group: "MegatronGroup") -> bool:
    par = group.config.parallel
    return (group.config.arch.is_moe and par.moe_token_dispatcher_type == "allgather"
            and par.expert_model_parallel_size > 1)


def _per_rank_payloads(group: "MegatronGroup", batch: RolloutBatch, indices: list[int],
                       fields: dict[str, torch.Tensor]) -> tuple[list, list[list[dict]]]:
    """(one argument per rank (shared by the ranks of a DP rank), micro-batches by DP rank)."""
    lengths = [len(batch.sequences[i].tokens) for i in indices]
    plan = plan_micro_batches(lengths, group.batch_plan, _length_multiple(group))
    arch = group.config.arch  # --use-rollout-routing-replay: every micro-batch carries the engine's routes
    route_shape = (arch.num_layers, arch.moe_router_topk) if group.config.use_rollout_routing_replay else None
    by_dp = [[build_micro_batch([indices[k] for k in rows], batch.sequences, fields, _length_multiple(group),
                                route_shape) for rows in micro_batches] for micro_batches in plan]
    if _needs_uniform_shapes(group):
        by_dp = uniform_shapes(by_dp)
    # numpy crosses Ray's object store without per-tensor pickling (torch tensors go through
    # torch.save once per storage); the rank turns them back into tensors
    refs = [group.share([{name: value.numpy() for name, value in mb.items()} for mb in micro_batches])
            for micro_batches in by_dp]
    return [refs[layout.data_rank] for layout in group.layouts], by_dp


def forward_rollout(group: "MegatronGroup", batch: RolloutBatch, weights: str = "policy") -> torch.Tensor:
    """[B, T] response-aligned log-probs of the response tokens under the actor's `weights` ("policy",
    "reference", "teacher") or values (critic), 0 on padding."""
    indices = list(range(len(batch)))
    args, by_dp = _per_rank_payloads(group, batch, indices, {})
    results = group.call_each(RankTrainer.forward, [(arg, weights) for arg in args])
    return _response_aligned(group, batch, by_dp, results, batch.masks.shape)


def forward_rollout_top_k(group: "MegatronGroup", batch: RolloutBatch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """--opd-type megatron --opd-estimator topk: the teacher weights' k likeliest tokens at every
    response position, ([B, T, k] ids, [B, T, k] log-probs), 0 on padding."""
    indices = list(range(len(batch)))
    args, by_dp = _per_rank_payloads(group, batch, indices, {})
    results = group.call_each(RankTrainer.teacher_top_k, [(arg, k) for arg in args])
    shape = (*batch.masks.shape, k)
    ids = _response_aligned(group, batch, by_dp, [r and [ids for ids, _ in r] for r in results], shape)
    log_probs = _response_aligned(group, batch, by_dp, [r and [lps for _, lps in r] for r in results], shape)
    return ids.long(), log_probs


def _response_aligned(group: "MegatronGroup", batch: RolloutBatch, by_dp: list[list[dict]], results: list,
                      shape: tuple[int, ...]) -> torch.Tensor:
    """The ranks' per-micro-batch [n, L, ...] results laid out response-aligned, [B, T, ...]."""
    out = torch.zeros(shape)
    for layout, result in zip(group.layouts, results):
        if result is None:
            continue
        for micro_batch, per_position in zip(by_dp[layout.data_rank], result):
            for i, values in response_values(micro_batch, per_position, batch.sequences).items():
                out[i, :values.shape[0]] = values
    return out


def _step_fields(algo: AlgorithmConfig, masks: torch.Tensor, indices: list[int],
                 sample_weights: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Loss masks and weights of one optimizer step, [B, T] (rows outside the step are 0 and count in no
    denominator of aggregation_weights); `sample_weights` [B]: each sample's Sample.loss_weight."""
    step_masks = torch.zeros_like(masks)
    step_masks[indices] = masks[indices]
    trained = step_masks.sum()
    if trained == 0:
        raise ValueError("an optimizer step has no trainable token (every sample of it FAILED or is fully "
                         "loss-masked)")
    return {"mask": step_masks, "weights": aggregation_weights(step_masks, algo.aggregation, algo.loss_norm_length,
                                                                sample_weights),
            "metric_weights": step_masks / trained}


def _optimizer_step(group: "MegatronGroup", batch: RolloutBatch, indices: list[int],
                    fields: dict[str, torch.Tensor]) -> dict[str, float]:
    """One optimizer step of `group` on the sequences `indices` (fields [B, T]); the ranks' metrics."""
    args, _ = _per_rank_payloads(group, batch, indices, fields)
    results = group.call_each(RankTrainer.train_step, [(arg,) for arg in args])
    (metrics,) = [r for r in results if r is not None]
    limit = group.train_config.max_consecutive_skipped_steps
    if metrics["consecutive_skipped_steps"] >= limit:
        raise NonFiniteStepsError(
            f"{group.role}: {int(metrics['consecutive_skipped_steps'])} optimizer steps in a row had a non-finite "
            f"loss or gradient (--max-consecutive-skipped-steps {limit}); stopping. Check rewards for NaN/inf "
            f"and lower --lr.")
    return metrics


def _mean_metrics(per_step: list[dict[str, float]], prefix: str) -> dict[str, float]:
    counters = ("optimizer_steps", "skipped_steps", "consecutive_skipped_steps", "loss_scale_overflows", "lr")
    out = {}
    for name in per_step[0]:
        values = [m[name] for m in per_step]
        out[f"{prefix}/{name}"] = values[-1] if name in counters else sum(values) / len(values)
    out[f"{prefix}/skipped"] = sum(m["skipped"] for m in per_step)
    return out


def train_rollout(actor: "MegatronGroup", groups: list[list[Sample]], step: int, options: TrainOptions) -> dict[str, float]:
    """One training step of the run loop: the user's hooks on the groups, then train_on_rollout
    (policy version `step` -> `step + 1`) inside `options.changing(step + 1)`; the step's metrics."""
    if not groups:
        raise RuntimeError(f"step {step}: no training data (the prompt data is used up?)")
    hook_metrics = options.before_training(groups)
    with options.changing(step + 1):
        metrics = train_on_rollout(actor, groups, policy_version=step, critic=options.critic,
                                   recompute_old=options.recompute_old, distillation=options.distillation)
    if options.check is not None:
        options.check(step, metrics)
    return {**metrics, **hook_metrics}


def train_on_rollout(actor: "MegatronGroup", groups: list[list[Sample]], policy_version: int,
                     critic: "MegatronGroup | None" = None, recompute_old: bool = False,
                     distillation: Distillation | None = None) -> dict[str, float]:
    """Train on one rollout (groups of Samples): old / reference log-probs and critic values as the
    algorithm needs (`recompute_old`: the old ones in any case), advantages, then --num-steps-per-rollout
    optimizer steps. `distillation` (--use-opd): the teacher's scores come from the samples (--opd-type
    sglang) or from the teacher's weights in the trainer (megatron: one forward pass over the rollout);
    with a top-k (--opd-estimator topk) the loss takes --opd-kl-coef x the reverse KL over the teacher's
    top-k (lean_rl/algorithms/distillation.py), made by the ranks from the student's logits; else the
    advantages take the teacher's per-token penalty against the old log-probs, recomputed unless
    --use-rollout-logprobs. train/opd_reverse_kl is the KL estimate. Returns metrics
    (train/loss, train/pg_clipfrac, train/kl_loss, train/entropy, train/grad_norm, train/lr,
    train/skipped_steps, train/reward_mean, rollout/trained_tokens, rollout/failed_frac ...,
    critic/... for PPO). Raises FailedSamplesError (nothing trained) when more than
    --max-failed-fraction of the samples FAILED."""
    actor.require_training()
    algo: AlgorithmConfig = actor.algorithm_config
    if algo.needs_critic and (critic is None or critic.role != "critic"):
        raise ValueError("--advantage-estimator ppo needs a critic group (set up with role='critic'): "
                         "train_on_rollout(..., critic=...)")
    started = time.perf_counter()
    batch = rollout_batch(groups)
    check_failed_fraction(batch, algo.max_failed_fraction)
    teacher, teacher_top = _teacher_scores(actor, groups, batch, distillation) if distillation else (None, None)
    # the sampled form: a penalty in the advantage
    penalty_coef = distillation.kl_coef if distillation and not distillation.top_k else None
    num_steps = actor.batch_plan.steps_for(len(batch))
    masks = batch.masks
    pairwise = algo.loss_type in PAIRWISE_LOSS_TYPES  # DPO / reward model: coefficients at the step's weights
    need_old = not algo.use_rollout_logprobs and (recompute_old or num_steps > 1 or algo.decoupled_ppo
                                                  or algo.kl_coef != 0 or penalty_coef is not None or pairwise)
    old = batch.rollout_log_probs if algo.use_rollout_logprobs else (
        forward_rollout(actor, batch) if need_old else None)
    ref = forward_rollout(actor, batch, weights="reference") if algo.needs_reference else None
    values = forward_rollout(critic, batch) if algo.needs_critic else None
    forward_s = time.perf_counter() - started
    kl_in_reward = kl_estimate(old, ref, "k1") * masks if algo.kl_coef != 0 else None
    pair_metrics: dict[str, float] = {}
    if pairwise:  # each row's coefficient of the step's pair loss (algorithms/preference.py)
        (advantages, pair_metrics), returns = pairwise_advantages(algo, old, ref, masks, batch.group_ids,
                                                                  batch.rewards), None
    else:  # --advantage-estimator, or --custom-advantage-function-path (algorithms/hooks.py)
        advantages, returns = compute_custom_or_builtin_advantages(algo, AdvantageInputs(
            rewards=batch.rewards, group_ids=batch.group_ids, mask=masks, valid=batch.valid,
            rollout_log_probs=batch.rollout_log_probs, old_log_probs=old, ref_log_probs=ref, values=values,
            kl=kl_in_reward, baseline_rewards=batch.baseline_rewards,
            response_lengths=torch.tensor([s.response_length for s in batch.sequences]),
            total_lengths=torch.tensor([len(s.tokens) for s in batch.sequences])))
    metrics = {**batch_metrics(batch, policy_version), **pair_metrics}
    if penalty_coef is not None:  # on-policy distillation, sampled: after any estimator, as slime applies it
        advantages, metrics["train/opd_reverse_kl"] = reverse_kl_advantages(advantages, old, teacher, masks,
                                                                            penalty_coef)
    if old is not None and ref is not None:  # equal before the first update (--ci-test checks it)
        metrics["train/old_ref_max_abs_diff"] = float(((old - ref).abs() * masks).max())
    metrics["rollout/advantage_mean"] = float((advantages * masks).sum() / masks.sum().clamp(min=1))
    if values is not None:
        metrics["rollout/value_mean"] = float((values * masks).sum() / masks.sum().clamp(min=1))
    per_step = len(batch) // num_steps
    actor_metrics, critic_metrics = [], []
    for step in range(num_steps):
        indices = list(range(step * per_step, (step + 1) * per_step))
        common = _step_fields(algo, masks, indices, batch.loss_weights)
        if critic is not None and algo.needs_critic:
            critic_metrics.append(_optimizer_step(critic, batch, indices,
                                                  {**common, "returns": returns, "old_values": values}))
        fields = {**common, "advantages": advantages}
        if teacher_top is not None and distillation is not None:  # the ranks add the top-k reverse KL to the loss
            fields.update(teacher_top_ids=teacher_top[0], teacher_top_log_probs=teacher_top[1])
            fields[OPD_WEIGHTS] = distillation.kl_coef * common["weights"]
        if old is not None:
            fields["old_log_probs"] = old
        if ref is not None:
            fields["ref_log_probs"] = ref
        fields["rollout_log_probs"] = batch.rollout_log_probs  # corrections, and the mismatch metrics every step
        actor_metrics.append(_optimizer_step(actor, batch, indices, fields))
    metrics.update(_mean_metrics(actor_metrics, "train"))
    metrics.update(pair_metrics)  # train/loss: the pair loss itself, not the ranks' per-row surrogate of it
    if critic_metrics:
        metrics.update(_mean_metrics(critic_metrics, "critic"))
    metrics["perf/forward_passes_s"] = forward_s  # old / reference log-probs, critic values
    metrics["perf/train_s"] = time.perf_counter() - started  # the whole call, driver's view
    return metrics


def _teacher_scores(actor: "MegatronGroup", groups: list[list[Sample]], batch: RolloutBatch,
                    distillation: Distillation) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
    """(the teacher's [B, T] log-probs of the sampled tokens, or None; with a top-k, ([B, T, K] ids,
    [B, T, K] log-probs), else None). --opd-type megatron: from the trainer's teacher weights."""
    if distillation.teacher_load is not None:
        if distillation.top_k:
            return None, forward_rollout_top_k(actor, batch, distillation.top_k)
        return forward_rollout(actor, batch, weights="teacher"), None
    teacher = _teacher_log_probs(groups, batch, bool(distillation.top_k))
    if not distillation.top_k:
        return teacher, None
    if batch.teacher_top_ids is None or batch.teacher_top_log_probs is None:
        raise ValueError("--opd-estimator topk: no sample of the batch has the teacher's top-k")
    return teacher, (batch.teacher_top_ids, batch.teacher_top_log_probs)


def _teacher_log_probs(groups: list[list[Sample]], batch: RolloutBatch, topk: bool) -> torch.Tensor:
    """[B, T] the teacher's log-probs (--use-opd); every sample that did not fail must have them (and
    under --opd-estimator topk the teacher's top-k too)."""
    field = "teacher_top_ids" if topk else "teacher_log_probs"
    unscored = [s.index for g in groups for s in g
                if s.status != Status.FAILED and s.response_length and not getattr(s, field)]
    if unscored:
        raise ValueError(f"--use-opd: samples {unscored[:4]} have no {field}; a custom rollout function "
                         "must score its samples with lean_rl.rollout.distillation.score_with_teacher")
    return batch.teacher_log_probs


