"""Training with real Megatron in Ray actors over gloo (2 processes, tiny models): the surrogate loss
falls on a fixed batch at TP=2, PP=2 and EP=2 (MoE); non-finite steps are skipped and counted and N in
a row stop the run; FAILED samples change nothing of a step and too many of them stop the run; PPO
trains its critic; offload is skipped on CPU."""

from __future__ import annotations

import math
import time

import pytest
import torch
from training_helpers import fixed_old_policy, make_groups, set_rollout_log_probs, train_config

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.rollout_batch import FailedSamplesError
from lean_rl.backends.megatron.train_driver import NonFiniteStepsError, train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.options import build

pytestmark = pytest.mark.integration
STEPS = 8


def _loss_curve(checkpoint, parallel: ParallelConfig, world_size: int = 2):
    algo = fixed_old_policy(kl_loss_coef=0.01, kl_loss_type="low_var_kl")
    with MegatronGroup.from_hf_checkpoint(checkpoint, parallel, world_size=world_size) as group:
        assert initialize_for_training(group, train_config(checkpoint, lr=1e-5), algo) == (0, None)
        groups = make_groups(seed=1)
        set_rollout_log_probs(group, groups)
        metrics, times = [], []
        for _ in range(STEPS):
            start = time.perf_counter()
            metrics.append(train_on_rollout(group, groups, policy_version=0))
            times.append(time.perf_counter() - start)
    curve = [m["train/pg_loss"] for m in metrics]
    print(f"\n{parallel}: pg_loss {[round(x, 4) for x in curve]}; "
          f"median train() {sorted(times)[len(times) // 2] * 1000:.0f} ms")
    return curve, metrics


def _check_falls(curve, metrics):
    assert all(math.isfinite(x) for x in curve)
    assert curve[-1] < curve[0] - 0.1, curve
    assert all(b < a for a, b in zip(curve, curve[1:])), curve  # every step lowers it
    kl = [m["train/kl_loss"] for m in metrics]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # policy == reference (the HF weights) at the start
    assert kl[-1] > 1e-4  # low_var_kl >= 0, and the policy moved away
    assert metrics[-1]["train/optimizer_steps"] == STEPS and metrics[-1]["train/skipped_steps"] == 0
    assert metrics[0]["train/pg_clipfrac"] == 0.0 and metrics[-1]["train/pg_clipfrac"] > 0


def test_loss_falls_at_tp2_and_pp2_along_the_same_curve(ray_cluster, tiny_qwen2):
    tp_curve, tp_metrics = _loss_curve(tiny_qwen2, ParallelConfig(tensor_model_parallel_size=2))
    _check_falls(tp_curve, tp_metrics)
    pp_curve, pp_metrics = _loss_curve(tiny_qwen2, ParallelConfig(pipeline_model_parallel_size=2))
    _check_falls(pp_curve, pp_metrics)
    # both compute the same model: the same trajectory up to float reassociation
    assert pp_curve == pytest.approx(tp_curve, abs=1e-4)


def test_loss_falls_for_moe_at_ep2(ray_cluster, tiny_model_factory):
    curve, metrics = _loss_curve(tiny_model_factory("qwen3_moe"), ParallelConfig(expert_model_parallel_size=2))
    _check_falls(curve, metrics)


def test_non_finite_steps_are_skipped_counted_and_n_in_a_row_stop_the_run(ray_cluster, tiny_qwen2):
    clean, poisoned = make_groups(seed=2), make_groups(seed=3)
    poisoned[0][0].reward = float("nan")  # NaN advantage for group 0 -> NaN loss and grads
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=2) as group:  # DP=2
        initialize_for_training(group, train_config(tiny_qwen2, max_skipped=2), build(AlgorithmConfig))
        probe = [s.tokens for g in clean for s in g]
        before = group.compute_log_probs(probe).log_probs
        skipped = train_on_rollout(group, poisoned, policy_version=0)
        assert skipped["train/skipped"] == 1 and skipped["train/skipped_steps"] == 1
        assert skipped["train/optimizer_steps"] == 0 and skipped["rollout/nonfinite_rewards"] == 1
        assert math.isnan(skipped["train/grad_norm"])
        after = group.compute_log_probs(probe).log_probs
        assert all(torch.equal(a, b) for a, b in zip(before, after)), "a skipped step changed the weights"
        ok = train_on_rollout(group, clean, policy_version=0)  # a finite step resets the run of skips
        assert ok["train/skipped"] == 0 and ok["train/optimizer_steps"] == 1 and ok["train/skipped_steps"] == 1
        assert ok["train/consecutive_skipped_steps"] == 0 and math.isfinite(ok["train/grad_norm"])
        train_on_rollout(group, poisoned, policy_version=0)
        with pytest.raises(NonFiniteStepsError, match=r"2 optimizer steps in a row .*--max-consecutive-skipped-steps 2"):
            train_on_rollout(group, poisoned, policy_version=0)


def test_a_failed_sample_changes_nothing_of_the_step_and_too_many_stop_the_run(ray_cluster, tiny_qwen2):
    """The same step (loss, gradient) with and without a FAILED member in each group: it is in no
    group statistic and no loss denominator. lr is tiny so the three steps see the same weights."""
    from lean_rl.sample import Status

    def failing(groups, members):
        for group in groups:
            for k in members:  # rewards are 1, 0, 1, 0, 1: the failed one would have pulled the mean down
                group[k].status, group[k].reward = Status.FAILED, 0.0
                group[k].metadata["reward_error"] = "TimeoutError: reward server"
        return groups

    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as group:
        initialize_for_training(group, train_config(tiny_qwen2, lr=1e-12), build(AlgorithmConfig))
        clean = train_on_rollout(group, [g[:4] for g in make_groups(seed=7, group_size=5)], policy_version=0)
        with_failed = train_on_rollout(group, failing(make_groups(seed=7, group_size=5), [4]), policy_version=0)
        with pytest.raises(FailedSamplesError, match=r"6 of 10 samples .*--max-failed-fraction 0\.5.*reward_error"):
            train_on_rollout(group, failing(make_groups(seed=7, group_size=5), [2, 3, 4]), policy_version=0)
    assert with_failed["rollout/failed_samples"] == 2 and with_failed["rollout/failed_frac"] == 0.2
    assert with_failed["train/optimizer_steps"] == 2 and with_failed["train/skipped"] == 0  # a counter of the run
    for name in ("train/loss", "train/pg_loss", "train/grad_norm", "rollout/trained_tokens", "train/reward_mean"):
        assert with_failed[name] == pytest.approx(clean[name], rel=1e-5, abs=1e-8), name


# slow (suite time, issue 24): tests/e2e/test_ppo.py trains the critic and the actor in the real loop by default
@pytest.mark.slow
def test_ppo_trains_a_critic_and_the_actor(ray_cluster, tiny_qwen2):
    algo = build(AlgorithmConfig, advantage_estimator="ppo", gamma=1.0, lambd=0.95, kl_coef=0.05)
    train = train_config(tiny_qwen2, lr=1e-3, num_steps_per_rollout=2)
    groups = make_groups(seed=4)
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as actor, \
            MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as critic:
        initialize_for_training(actor, train, algo, role="actor")
        initialize_for_training(critic, train, algo, role="critic")
        history = [train_on_rollout(actor, groups, policy_version=v, critic=critic) for v in range(4)]
        assert actor.offload() == {"offloaded": False, "reason": "device is cpu"}
    critic_loss = [m["critic/loss"] for m in history]
    print(f"\nPPO critic loss {[round(x, 4) for x in critic_loss]}")
    assert history[0]["rollout/value_mean"] == 0.0  # the value head starts at 0
    assert history[-1]["rollout/value_mean"] != 0.0
    assert critic_loss[-1] < 0.5 * critic_loss[0]
    # two optimizer steps per rollout: the second sees the first's update against the recomputed
    # old policy, so the mean old-vs-current log-ratio is no longer 0
    assert history[0]["train/ppo_kl"] != 0.0 and history[0]["train/optimizer_steps"] == 2
    assert all(math.isfinite(m["train/loss"]) for m in history)


def test_dynamic_batching_and_balance_give_the_same_step_as_fixed_micro_batches(ray_cluster, tiny_qwen2):
    """Loss weights are normalised over the whole step on the driver, so how sequences are spread over
    DP ranks and micro-batches must not change the step (only float summation order)."""
    algo = build(AlgorithmConfig, use_tis=True, entropy_coef=0.01)
    runs = []
    for batching in (dict(micro_batch_size=1), dict(use_dynamic_batch_size=True, max_tokens_per_gpu=24,
                                                    balance_data=True)):
        groups = make_groups(seed=5, num_groups=3)
        with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=2) as group:
            initialize_for_training(group, train_config(tiny_qwen2, lr=1e-4, **batching), algo)
            set_rollout_log_probs(group, groups)
            runs.append([train_on_rollout(group, groups, policy_version=0) for _ in range(2)])
    fixed, dynamic = runs
    for a, b in zip(fixed, dynamic):
        for name in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/tis_weight"):
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-7), name
    # the rollout log-probs are this policy's own: TIS weights are 1 on the first step
    assert fixed[0]["train/tis_weight"] == pytest.approx(1.0, abs=1e-5)
    assert fixed[0]["train/tis_clipfrac"] == 0.0


def test_chunked_logits_give_the_same_steps_as_full_logits_at_tp2(ray_cluster, tiny_qwen2):
    """--logits-chunk-size: the model hands back hidden states and the log-probs, entropy (with its
    gradient) and KL are made 5 tokens at a time, recomputed in the backward; the steps must be those
    of the full logits (--logits-chunk-size 0) up to float summation order, the TP=2 vocab shards too."""
    algo = fixed_old_policy(entropy_coef=0.01, kl_loss_coef=0.01, kl_loss_type="low_var_kl")
    runs = []
    for chunk in (0, 5):
        groups = make_groups(seed=3)
        with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(tensor_model_parallel_size=2),
                                              world_size=2) as group:
            initialize_for_training(group, train_config(tiny_qwen2, lr=1e-4, logits_chunk_size=chunk), algo)
            set_rollout_log_probs(group, groups)
            runs.append([train_on_rollout(group, groups, policy_version=0) for _ in range(3)])
    full, chunked = runs
    for a, b in zip(full, chunked):
        for name in ("train/loss", "train/pg_loss", "train/entropy", "train/kl_loss", "train/grad_norm"):
            assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-6), name
    assert full[-1]["train/pg_loss"] < full[0]["train/pg_loss"]  # the steps moved the policy


def test_decoupled_ppo_and_the_lr_schedule(ray_cluster, tiny_qwen2):
    groups = make_groups(seed=6, version=1)  # generated by policy version 1, trained at version 3
    algo = build(AlgorithmConfig, decoupled_ppo=True, behav_imp_weight_cap=5.0)
    schedule = dict(lr_warmup_iters=2, lr_decay_style="cosine", lr_decay_iters=4, min_lr=1e-5)
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(), world_size=1) as group:
        initialize_for_training(group, train_config(tiny_qwen2, lr=1e-4, optimizer=schedule), algo)
        set_rollout_log_probs(group, groups)
        for sample in (s for g in groups for s in g):  # the behaviour policy differed a little
            sample.rollout_log_probs = [lp - 0.1 for lp in sample.rollout_log_probs]
        history = [train_on_rollout(group, groups, policy_version=3) for _ in range(4)]
    metrics = history[0]
    assert metrics["rollout/stale_token_frac"] == 1.0 and metrics["rollout/max_staleness"] == 2
    # exp(prox - behav) = exp(0.1) on every token, none above the cap
    assert metrics["train/behav_weight"] == pytest.approx(math.exp(0.1), rel=1e-4)
    assert metrics["train/behav_dropped_frac"] == 0.0 and metrics["train/optimizer_steps"] == 1
    # linear warmup from 0 over 2 steps, then cosine to min_lr by step 4:
    # step 4 (3 done): ratio (3 - 2) / (4 - 2) = 0.5 -> 1e-5 + 0.5 * (1 + cos(pi / 2)) * 9e-5 = 5.5e-5
    assert [m["train/lr"] for m in history] == pytest.approx([0.0, 5e-5, 1e-4, 5.5e-5])


@pytest.mark.slow
@pytest.mark.parametrize("arch, parallel", [
    ("qwen2", ParallelConfig(tensor_model_parallel_size=2)),
    ("qwen2", ParallelConfig(pipeline_model_parallel_size=2)),  # only the last stage sees the loss
    ("qwen3_moe", ParallelConfig(expert_model_parallel_size=2)),
], ids=["tp2", "pp2", "moe-ep2"])
def test_a_nan_step_is_skipped_at(arch, parallel, ray_cluster, tiny_model_factory):
    checkpoint = tiny_model_factory(arch)
    poisoned = make_groups(seed=3)
    poisoned[1][2].reward = float("inf")  # inf - inf in the group mean: NaN advantages
    with MegatronGroup.from_hf_checkpoint(checkpoint, parallel, world_size=2) as group:
        initialize_for_training(group, train_config(checkpoint), build(AlgorithmConfig))
        probe = [s.tokens for g in poisoned for s in g]
        before = group.compute_log_probs(probe).log_probs
        metrics = train_on_rollout(group, poisoned, policy_version=0)
        after = group.compute_log_probs(probe).log_probs
    assert metrics["train/skipped_steps"] == 1 and metrics["train/optimizer_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_a_teacher_inside_the_trainer_scores_its_top_k_and_the_student_moves_towards_it(
        ray_cluster, tiny_qwen2, tiny_model_factory, tmp_path):
    """--opd-type megatron at TP=2 (the top-k picked across the two vocab shards): the teacher's weights,
    loaded from a torch_dist checkpoint into host memory, give the teacher's top-k and sampled-token
    log-probs (checked against transformers on the teacher's HF checkpoint), leave the policy's weights as
    they were, and the top-k reverse KL to them falls over a few steps with no advantage at all."""
    import transformers

    from lean_rl.backends.megatron.rank_trainer import RankTrainer
    from lean_rl.backends.megatron.rollout_batch import rollout_batch
    from lean_rl.backends.megatron.train_driver import forward_rollout, forward_rollout_top_k
    from lean_rl.backends.megatron.train_options import Distillation
    from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron

    top_k = 5
    teacher_hf = tiny_model_factory("qwen2", seed=1)
    teacher_dist = convert_hf_to_megatron(teacher_hf, tmp_path / "teacher")
    groups = make_groups(seed=5)
    for sample in (s for g in groups for s in g):
        sample.reward = 0.0  # no advantage: only the teacher's signal moves the policy
    batch = rollout_batch(groups)
    with MegatronGroup.from_hf_checkpoint(tiny_qwen2, ParallelConfig(tensor_model_parallel_size=2),
                                          world_size=2) as group:
        initialize_for_training(group, train_config(tiny_qwen2, lr=1e-3), build(AlgorithmConfig))
        group.call_all(RankTrainer.load_teacher, str(teacher_dist))
        policy_before = forward_rollout(group, batch)
        ids, log_probs = forward_rollout_top_k(group, batch, top_k)
        sampled = forward_rollout(group, batch, weights="teacher")
        assert torch.equal(forward_rollout(group, batch), policy_before)  # the policy's weights are back
        history = [train_on_rollout(group, groups, policy_version=step,
                                    distillation=Distillation(kl_coef=1.0, top_k=top_k, teacher_load=str(teacher_dist)))
                   for step in range(4)]
    model = transformers.AutoModelForCausalLM.from_pretrained(teacher_hf, dtype=torch.float32)
    for i, sample in enumerate(s for g in groups for s in g):
        with torch.no_grad():
            every = torch.log_softmax(model(torch.tensor([sample.tokens])).logits[0, :-1], -1)[-sample.response_length:]
        n = sample.response_length
        want_values, want_ids = every.topk(top_k, dim=-1)
        assert torch.allclose(log_probs[i, :n], want_values, atol=1e-4), i
        assert torch.equal(ids[i, :n], want_ids), i
        targets = torch.tensor(sample.response_tokens)
        assert torch.allclose(sampled[i, :n], every.gather(-1, targets[:, None])[:, 0], atol=1e-4), i
    kl = [m["train/opd_reverse_kl"] for m in history]
    print(f"\nteacher in the trainer: top-{top_k} reverse KL per step {[round(x, 4) for x in kl]}")
    assert kl[-1] < kl[0] and all(m["rollout/advantage_mean"] == 0 for m in history)
