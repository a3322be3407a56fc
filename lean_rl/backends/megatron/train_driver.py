"""Driver side of training: a rollout (sample groups) -> forward passes for old / reference
log-probs and critic values -> advantages -> optimizer steps, each split into per-DP-rank
micro-batches. Called through MegatronActorGroup.train; the math is in lean_rl/algorithms, the
micro-batch layout in train_batches.py, the rank side in rank_trainer.py.

Old log-probs are recomputed only when they can differ from the current policy's at the step that
uses them: with several optimizer steps per rollout (steps 2.. see an updated policy), decoupled PPO
(the proximal policy), or KL in the reward (needed before training). Otherwise the loss uses the
current log-probs detached, which are exactly the old ones on the first step."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from lean_rl.algorithms.advantages import compute_advantages
from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.kl import kl_estimate
from lean_rl.algorithms.losses import aggregation_weights
from lean_rl.backends.megatron.rollout_batch import RolloutBatch, pad, rollout_batch, rollout_metrics, unpad
from lean_rl.backends.megatron.train_batches import (build_micro_batch, plan_micro_batches, response_values,
                                                     uniform_shapes)
from lean_rl.backends.megatron.train_config import TrainConfig
from lean_rl.sample import Sample

if TYPE_CHECKING:
    from lean_rl.backends.megatron.group import MegatronActorGroup


class NonFiniteStepsError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def _length_multiple(group: "MegatronActorGroup") -> int:
    par = group.config.parallel
    return par.tensor_model_parallel_size if par.sequence_parallel else 1


def _needs_uniform_shapes(group: "MegatronActorGroup") -> bool:
    par = group.config.parallel
    return (group.config.arch.is_moe and par.moe_token_dispatcher_type == "allgather"
            and par.expert_model_parallel_size > 1)


def _per_rank_payloads(group: "MegatronActorGroup", batch: RolloutBatch, indices: list[int],
                       fields: dict[str, list[torch.Tensor]]) -> tuple[list, list[list[dict]]]:
    """(one argument per actor (ObjectRefs, shared by the ranks of a DP rank), micro-batches by DP rank)."""
    import ray

    lengths = [len(batch.sequences[i].tokens) for i in indices]
    plan = plan_micro_batches(lengths, group.data_parallel_size, group.train_config.batch, _length_multiple(group))
    by_dp = [[build_micro_batch([indices[k] for k in rows], batch.sequences, fields, _length_multiple(group))
              for rows in micro_batches] for micro_batches in plan]
    if _needs_uniform_shapes(group):
        by_dp = uniform_shapes(by_dp)
    # numpy crosses Ray's object store without per-tensor pickling (torch tensors go through
    # torch.save once per storage); the rank turns them back into tensors
    refs = [ray.put([{name: value.numpy() for name, value in mb.items()} for mb in micro_batches])
            for micro_batches in by_dp]
    return [refs[layout.data_rank] for layout in group.layouts], by_dp


def forward_rollout(group: "MegatronActorGroup", batch: RolloutBatch, reference: bool = False) -> list[torch.Tensor]:
    """Per sequence: [R_i] log-probs of its response tokens (actor; reference weights if asked) or
    values (critic)."""
    indices = list(range(len(batch)))
    args, by_dp = _per_rank_payloads(group, batch, indices, {})
    results = group._call_all_with("forward_pass", [(arg, reference) for arg in args])
    out: dict[int, torch.Tensor] = {}
    for layout, result in zip(group.layouts, results):
        if result is None:
            continue
        for micro_batch, per_position in zip(by_dp[layout.data_rank], result):
            out.update(response_values(micro_batch, per_position, batch.sequences))
    return [out[i] for i in indices]


def _step_fields(algo: AlgorithmConfig, masks: torch.Tensor, index: torch.Tensor) -> dict[str, torch.Tensor]:
    step_masks = masks[index]
    trained = step_masks.sum()
    if trained == 0:
        raise ValueError("an optimizer step has no trainable token (every sample FAILED or fully loss-masked)")
    return {"mask": step_masks, "weights": aggregation_weights(step_masks, algo.aggregation, algo.loss_norm_length),
            "metric_weights": step_masks / trained}


def _train_step(group: "MegatronActorGroup", batch: RolloutBatch, indices: list[int],
                padded: dict[str, torch.Tensor]) -> dict[str, float]:
    lengths = [batch.sequences[i].response_length for i in indices]
    fields = {name: dict(zip(indices, unpad(values, lengths))) for name, values in padded.items()}
    full = {name: [per_index.get(i, torch.zeros(0)) for i in range(len(batch))] for name, per_index in fields.items()}
    args, _ = _per_rank_payloads(group, batch, indices, full)
    results = group._call_all_with("train_step", [(arg,) for arg in args])
    (metrics,) = [r for r in results if r is not None]
    limit = group.train_config.max_consecutive_skipped_steps
    if metrics["consecutive_skipped_steps"] >= limit:
        raise NonFiniteStepsError(
            f"{group.role}: {int(metrics['consecutive_skipped_steps'])} optimizer steps in a row had a non-finite "
            f"loss or gradient (--max-consecutive-skipped-steps {limit}); stopping. Check rewards for NaN/inf "
            f"and lower --lr.")
    return metrics


def _mean_metrics(per_step: list[dict[str, float]], prefix: str) -> dict[str, float]:
    counters = ("optimizer_steps", "skipped_steps", "consecutive_skipped_steps", "lr")
    out = {}
    for name in per_step[0]:
        values = [m[name] for m in per_step]
        out[f"{prefix}/{name}"] = values[-1] if name in counters else sum(values) / len(values)
    out[f"{prefix}/skipped"] = sum(m["skipped"] for m in per_step)
    return out


def train_on_rollout(actor: "MegatronActorGroup", groups: list[list[Sample]], policy_version: int,
                     critic: "MegatronActorGroup | None" = None) -> dict[str, float]:
    algo: AlgorithmConfig = actor.algorithm_config
    train: TrainConfig = actor.train_config
    if algo.needs_critic and (critic is None or critic.role != "critic"):
        raise ValueError("--advantage-estimator ppo needs a critic group (set up with role='critic'): "
                         "train(..., critic=...)")
    started = time.perf_counter()
    batch = rollout_batch(groups)
    num_steps = train.batch.steps_for(len(batch), actor.data_parallel_size)
    masks = pad(batch.masks)
    rollout_lp = pad(batch.rollout_log_probs, masks.shape[1])
    need_old = not algo.use_rollout_logprobs and (num_steps > 1 or algo.decoupled_ppo or algo.kl_coef != 0)
    old = rollout_lp if algo.use_rollout_logprobs else (
        pad(forward_rollout(actor, batch), masks.shape[1]) if need_old else None)
    ref = pad(forward_rollout(actor, batch, reference=True), masks.shape[1]) if algo.needs_reference else None
    values = pad(forward_rollout(critic, batch), masks.shape[1]) if algo.needs_critic else None
    forward_s = time.perf_counter() - started
    kl_in_reward = kl_estimate(old, ref, "k1") * masks if algo.kl_coef != 0 else None
    advantages, returns = compute_advantages(
        algo.advantage_estimator, batch.rewards, batch.group_ids, masks, kl=kl_in_reward, kl_coef=algo.kl_coef,
        values=values, gamma=algo.gamma, lam=algo.lambd, normalize=algo.normalize_advantages)
    metrics = rollout_metrics(batch, policy_version)
    metrics["rollout/advantage_mean"] = float((advantages * masks).sum() / masks.sum().clamp(min=1))
    if values is not None:
        metrics["rollout/value_mean"] = float((values * masks).sum() / masks.sum().clamp(min=1))
    per_step = len(batch) // num_steps
    actor_metrics, critic_metrics = [], []
    for step in range(num_steps):
        indices = list(range(step * per_step, (step + 1) * per_step))
        index = torch.tensor(indices)
        common = _step_fields(algo, masks, index)
        if critic is not None and algo.needs_critic:
            critic_metrics.append(_train_step(critic, batch, indices, {
                **common, "returns": returns[index], "old_values": values[index]}))
        fields = {**common, "advantages": advantages[index]}
        if old is not None:
            fields["old_log_probs"] = old[index]
        if ref is not None:
            fields["ref_log_probs"] = ref[index]
        if algo.use_tis or algo.decoupled_ppo:
            fields["rollout_log_probs"] = rollout_lp[index]
        actor_metrics.append(_train_step(actor, batch, indices, fields))
    metrics.update(_mean_metrics(actor_metrics, "train"))
    if critic_metrics:
        metrics.update(_mean_metrics(critic_metrics, "critic"))
    metrics["perf/forward_passes_s"] = forward_s  # old / reference log-probs, critic values
    metrics["perf/train_s"] = time.perf_counter() - started  # the whole call, driver's view
    return metrics


def initialize_for_training(group: "MegatronActorGroup", train: TrainConfig, algo: AlgorithmConfig,
                            role: str = "actor", actor_step: int = 0) -> tuple[int, dict | None]:
    """Where the weights come from, as a slime user expects:
    - resume: --load (critic: --critic-load, default LOAD/critic) holds a complete checkpoint -> load
      it (any layout). The critic of a resumed actor (actor_step > 0) loads its checkpoint of that
      same step: the driver saves the critic before the actor, so the actor's step always has one;
    - else start from --hf-checkpoint;
    - reference (when a KL term needs it): --ref-load, else the --hf-checkpoint weights (the policy's
      starting point), loaded before any resume so a resumed run keeps the same reference."""
    from lean_rl.backends.megatron.checkpoint_paths import iteration_dir, latest_step
    from lean_rl.backends.megatron.config import ConfigError
    from lean_rl.backends.megatron.hf_config import hf_family

    ckpt = train.checkpoint
    load_root, load_flag = (ckpt.load, "--load") if role == "actor" else (ckpt.critic_load_dir, "--critic-load")
    resume = load_root is not None and latest_step(load_root) is not None
    if role == "critic" and actor_step:
        if load_root is None or not iteration_dir(load_root, actor_step).is_dir():
            raise ConfigError(f"the actor resumed at step {actor_step}, but the critic has no checkpoint of that step "
                              f"({load_flag} {load_root}); point --critic-load at the critic saved with it")
        resume = True
    hf = ckpt.hf_checkpoint
    if not resume and hf is None:
        raise ConfigError(f"nothing to start the {role} from: {load_flag} {load_root} holds no checkpoint and "
                          "--hf-checkpoint is not set")
    if role == "actor" and algo.needs_reference and ckpt.ref_load is None and hf is None:
        raise ConfigError("--kl-loss-coef / --kl-coef need a reference model: --ref-load or --hf-checkpoint")
    reference_from_hf = role == "actor" and algo.needs_reference and ckpt.ref_load is None
    if hf is not None and (not resume or reference_from_hf):
        group.load_hf_checkpoint(hf)
    elif hf is not None:  # resuming: the checkpoint has the weights; the family names them for export
        group.family = hf_family(hf)
    group.setup_training(train, algo, role)
    if role == "actor" and algo.needs_reference:
        if ckpt.ref_load is not None:
            group._call_all("load_reference", str(ckpt.ref_load))
        else:
            group._call_all("snapshot_reference")
    if resume:
        return group.load_checkpoint(load_root, step=actor_step or None)
    return 0, None
