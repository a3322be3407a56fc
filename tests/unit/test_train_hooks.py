"""The hooks around training, with a real hook module: --rollout-sample-filter-path (a rejected sample
trains nothing but stays in its group's statistics), --custom-reward-post-process-path (the rewards
the advantages see), --custom-advantage-function-path and --custom-loss-function-path (what they may
return). Where these hooks are called inside Megatron: tests/integration/test_custom_training_hooks.py."""

import sys
import textwrap
import types

import pytest
import torch

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.hooks import (AdvantageInputs, builtin_advantages, checked_advantages, checked_loss,
                                      compute_custom_or_builtin_advantages, loss_function)
from lean_rl.algorithms.losses import policy_loss
from lean_rl.backends.megatron.rollout_batch import rollout_batch
from lean_rl.hook_protocols import Extensions
from lean_rl.train_hooks import before_training
from lean_rl.sample import Sample, Status
from lean_rl.utils.plugins import HookReturnError
from lean_rl.options import build

HOOKS = textwrap.dedent("""
    import torch
    from lean_rl.algorithms.hooks import builtin_advantages
    from lean_rl.algorithms.losses import policy_loss

    def keep_the_shortest(cfg, group):
        shortest = min(s.response_length for s in group)
        return [s.response_length == shortest for s in group]

    def rank_in_group(cfg, group):
        order = sorted(range(len(group)), key=lambda i: group[i].reward)
        ranks = [0.0] * len(group)
        for rank, i in enumerate(order):
            ranks[i] = float(rank)
        return ranks

    def divide_by_zero_std(cfg, group):
        rewards = torch.tensor([s.reward for s in group])
        return ((rewards - rewards.mean()) / rewards.std()).tolist()  # all equal: 0 / 0

    def sequence_advantages(algo, inputs):
        return inputs.rewards * algo.custom["scale"]

    def doubled(algo, inputs):
        advantages, returns = builtin_advantages(algo, inputs)
        return 2 * advantages, returns

    def tripled_loss(algo, **inputs):
        loss, metrics = policy_loss(algo, **inputs)
        return 3 * loss, {**metrics, "scale": 3}
""")


@pytest.fixture
def hooks(tmp_path, monkeypatch):
    (tmp_path / "train_hooks_mod.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import train_hooks_mod

    yield train_hooks_mod
    sys.modules.pop("train_hooks_mod", None)


def _cfg(**paths):
    return types.SimpleNamespace(
        rollout=types.SimpleNamespace(rollout_sample_filter_path=paths.get("filter"),
                                      sampling=types.SimpleNamespace(max_response_len=16)),
        reward=types.SimpleNamespace(custom_reward_post_process_path=paths.get("post"), overlong_buffer_len=None,
                                     overlong_filtering=False))


def _group(rewards, lengths, group=0, start=0):
    samples = []
    for i, (reward, length) in enumerate(zip(rewards, lengths)):
        s = Sample(index=start + i, group_index=group, prompt="p", tokens=[5, 6])
        s.append_response(list(range(7, 7 + length)), log_probs=[-1.0] * length, weight_versions=0)
        s.status, s.reward = Status.COMPLETED, reward
        samples.append(s)
    return samples


def _ext(sample_filter=None, post=None):
    return Extensions(rollout=None, generate=None, reward=None, group_reward=False, dynamic_filter=None,
                      sample_filter=sample_filter, reward_post_process=post)


def test_a_rejected_sample_trains_nothing_but_stays_in_its_group_statistics(hooks):
    groups = [_group([1.0, 0.0, 0.0], [2, 3, 2])]
    metrics = before_training(_cfg(filter="m.keep_the_shortest"), _ext(hooks.keep_the_shortest), groups)
    assert metrics == {"train/samples_rejected": 1.0}
    assert groups[0][1].loss_mask == [0, 0, 0] and groups[0][1].metadata["sample_filter"] == "rejected"
    batch = rollout_batch(groups)
    assert batch.masks.sum(dim=1).tolist() == [2.0, 0.0, 2.0] and batch.valid.all()
    advantages, _ = builtin_advantages(build(AlgorithmConfig, advantage_estimator="dr_grpo", max_response_len=8), AdvantageInputs(
        rewards=batch.rewards, group_ids=batch.group_ids, mask=batch.masks, valid=batch.valid,
        rollout_log_probs=batch.rollout_log_probs))
    # the group mean is still over all three rewards (1/3), as in slime: the rejected one counts there
    assert advantages[0, :2].tolist() == pytest.approx([2 / 3, 2 / 3]) and advantages[1].abs().sum() == 0


def test_the_post_processed_rewards_are_trained_and_the_raw_ones_kept(hooks):
    groups = [_group([0.5, 2.0, 1.0], [1, 1, 1]), _group([3.0, 3.0], [1, 1], group=1, start=3)]
    groups[0][1].status, groups[0][1].reward = Status.FAILED, 0.0
    metrics = before_training(_cfg(post="m.rank_in_group"), _ext(post=hooks.rank_in_group), groups)
    assert [s.reward for s in groups[0]] == [1.0, 0.0, 2.0]  # ranks of 0.5, 0 (FAILED, untouched), 1.0
    assert groups[0][0].metadata["raw_reward"] == 0.5 and "raw_reward" not in groups[0][1].metadata
    assert [s.reward for s in groups[1]] == [0.0, 1.0]
    assert metrics["train/raw_reward_mean"] == pytest.approx((0.5 + 1.0 + 3.0 + 3.0) / 4)
    assert rollout_batch(groups).rewards.tolist() == [1.0, 0.0, 2.0, 0.0, 1.0]


@pytest.mark.parametrize("hook, returned, message", [
    ("filter", lambda cfg, g: True, r"returned bool True; it must return a list of 2 bools"),
    ("filter", lambda cfg, g: [True], r"returned list \[True\]; it must return a list of 2 bools"),
    ("filter", lambda cfg, g: [1, 0], r"returned list \[1, 0\]; it must return a list of 2 bools"),
    ("post", lambda cfg, g: [1.0], r"returned list \[1.0\]; it must return a list of 2 finite numbers"),
    ("post", lambda cfg, g: ["1", 2], r"returned list \['1', 2\]; it must return a list of 2 finite numbers"),
])
def test_a_wrong_return_stops_the_run_naming_the_flag(hook, returned, message):
    flag = {"filter": "--rollout-sample-filter-path m.f", "post": "--custom-reward-post-process-path m.f"}[hook]
    ext = _ext(sample_filter=returned) if hook == "filter" else _ext(post=returned)
    with pytest.raises(HookReturnError, match=rf"^{flag} \(.*\) {message}"):
        before_training(_cfg(**{hook: "m.f"}), ext, [_group([1.0, 0.0], [1, 1])])


def test_a_non_finite_post_processed_reward_stops_the_run_naming_the_sample(hooks):
    with pytest.raises(HookReturnError, match=r"--custom-reward-post-process-path m.f \(train_hooks_mod.divide_by_zero_std"
                                              r"\) returned .*; sample 0 \(group 0\) got nan"):
        before_training(_cfg(post="m.f"), _ext(post=hooks.divide_by_zero_std), [_group([1.0, 1.0], [1, 1])])


MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def _inputs():
    return AdvantageInputs(rewards=torch.tensor([1.0, 0.0, 1.0]), group_ids=torch.tensor([0, 0, 0]), mask=MASK,
                           valid=torch.tensor([True, True, False]), rollout_log_probs=torch.zeros(3, 3))


def test_a_custom_advantage_function_replaces_the_estimator(hooks):
    scaled = build(AlgorithmConfig, custom_advantage_function_path="train_hooks_mod.sequence_advantages",
                             custom={"scale": 2.0})
    advantages, returns = compute_custom_or_builtin_advantages(scaled, _inputs())
    # [B] sequence values spread over each sequence's trained tokens; 0 where the mask is 0
    assert advantages.tolist() == [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]] and returns is None
    doubled = build(AlgorithmConfig, custom_advantage_function_path="train_hooks_mod.doubled")
    builtin, _ = compute_custom_or_builtin_advantages(build(AlgorithmConfig), _inputs())
    assert torch.equal(compute_custom_or_builtin_advantages(doubled, _inputs())[0], 2 * builtin)


@pytest.mark.parametrize("result, message", [
    (None, r"returned NoneType None; it must return a tensor of advantages shaped \[B, T\] = \[3, 3\]"),
    (torch.zeros(3, 2), r"got shape \[3, 2\]"),
    ((torch.zeros(3, 3), torch.zeros(2)), r"got shape \[3, 3\] and returns \[2\]"),
    ([1.0, 2.0, 3.0], "returned list"),
])
def test_a_custom_advantage_of_the_wrong_shape_stops_the_run(result, message):
    algo = build(AlgorithmConfig, custom_advantage_function_path="m.adv")
    with pytest.raises(HookReturnError, match=rf"(?s)^--custom-advantage-function-path m.adv \(.*\) .*{message}"):
        checked_advantages(algo, lambda a, i: result, result, MASK)
    ppo = build(AlgorithmConfig, advantage_estimator="ppo", custom_advantage_function_path="m.adv")
    with pytest.raises(HookReturnError, match="with --advantage-estimator ppo the pair \\(advantages, returns\\)"):
        checked_advantages(ppo, lambda a, i: None, torch.zeros(3, 3), MASK)


def _loss_inputs():
    torch.manual_seed(0)
    log_probs = torch.randn(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return dict(log_probs=log_probs, advantages=torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]), mask=mask,
                weights=mask / mask.sum(), metric_weights=mask / mask.sum(), old_log_probs=None, ref_log_probs=None,
                rollout_log_probs=None, entropy=None)


def test_a_custom_loss_replaces_the_policy_loss_on_the_rank(hooks):
    algo = build(AlgorithmConfig)
    assert loss_function(algo) is policy_loss
    custom = loss_function(build(AlgorithmConfig, custom_loss_function_path="train_hooks_mod.tripled_loss"))
    inputs = _loss_inputs()
    loss, metrics = custom(algo, **inputs)
    base, base_metrics = policy_loss(algo, **inputs)
    assert loss.item() == pytest.approx(3 * base.item()) and metrics["scale"].item() == 3.0
    assert metrics["pg_loss"].item() == pytest.approx(base_metrics["pg_loss"].item())
    loss.backward()
    assert inputs["log_probs"].grad.abs().sum() > 0


@pytest.mark.parametrize("result, message", [
    (lambda x: x, r"it must return a pair \(loss: a 0-d tensor with a gradient"),
    (lambda x: (x.detach(), {}), "this loss carries no gradient"),
    (lambda x: (x, {"clip": torch.ones(2)}), "metric 'clip' is not a scalar"),
    (lambda x: (x, [1.0]), r"it must return a pair"),
])
def test_a_custom_loss_of_the_wrong_kind_stops_the_run(result, message):
    loss = (torch.ones(2, requires_grad=True) * 2).sum()
    with pytest.raises(HookReturnError, match=rf"^--custom-loss-function-path m.loss \(.*\) returned .*{message}"):
        checked_loss("m.loss", lambda *a, **k: None, result(loss))
