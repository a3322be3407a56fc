"""--custom-advantage-function-path and --custom-loss-function-path inside real Megatron training (Ray
actors over gloo, the tiny Qwen2): the same batch from the same weights trained with the built-in
advantages and loss, then with a module of the user's (in a directory of its own, reaching the ranks
through the driver's PYTHONPATH) whose advantages are twice the built-in's and whose loss is three
times the built-in's. The advantage hook shows in rollout/advantage_mean (x2, the driver computes it);
the loss hook must then make the gradient norm x6 (PPO's loss is linear in the advantages at ratio 1,
the first step after generation), which it only does if every rank of the DP=2 group called it."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from training_helpers import make_groups, train_config

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.group import MegatronGroup
from lean_rl.backends.megatron.train_driver import train_on_rollout
from lean_rl.backends.megatron.trainer_init import initialize_for_training
from lean_rl.options import build

pytestmark = pytest.mark.integration

HOOKS = textwrap.dedent("""
    from lean_rl.algorithms.hooks import builtin_advantages
    from lean_rl.algorithms.losses import policy_loss


    def doubled_advantages(algo, inputs):
        advantages, returns = builtin_advantages(algo, inputs)
        return 2 * advantages, returns


    def tripled_loss(algo, **inputs):
        loss, metrics = policy_loss(algo, **inputs)
        # a metric weighted as the built-in ones: summed over micro-batches and ranks it is the step's 3.0
        return 3 * loss, {**metrics, "loss_scale": (inputs["metric_weights"] * 3.0).sum()}
""")


@pytest.fixture
def hook_module(tmp_path, monkeypatch):
    """The user's module in a directory of its own, on the driver's PYTHONPATH (as `PYTHONPATH=dir
    python -m lean_rl.train` puts it) and sys.path."""
    (tmp_path / "user_training_hooks.py").write_text(HOOKS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_training_hooks"
    sys.modules.pop("user_training_hooks", None)


def _first_step(checkpoint, algo: AlgorithmConfig, world_size: int) -> dict[str, float]:
    with MegatronGroup.from_hf_checkpoint(checkpoint, ParallelConfig(), world_size=world_size) as group:
        initialize_for_training(group, train_config(checkpoint, lr=1e-4), algo)
        return train_on_rollout(group, make_groups(seed=11), policy_version=0)


def test_the_custom_advantage_and_loss_are_the_ones_the_trainer_uses(ray_cluster, tiny_qwen2, hook_module):
    builtin = _first_step(tiny_qwen2, build(AlgorithmConfig), world_size=1)
    custom = _first_step(tiny_qwen2, build(AlgorithmConfig,
        custom_advantage_function_path=f"{hook_module}.doubled_advantages",
        custom_loss_function_path=f"{hook_module}.tripled_loss"), world_size=2)
    print(f"\nbuilt-in: grad_norm {builtin['train/grad_norm']:.6g}, advantage_mean "
          f"{builtin['rollout/advantage_mean']:.6g}; custom: grad_norm {custom['train/grad_norm']:.6g}, "
          f"advantage_mean {custom['rollout/advantage_mean']:.6g}")
    assert builtin["rollout/advantage_mean"] != 0.0 and builtin["train/grad_norm"] > 0.0
    assert custom["rollout/advantage_mean"] == pytest.approx(2 * builtin["rollout/advantage_mean"], rel=1e-6)
    assert custom["train/grad_norm"] == pytest.approx(6 * builtin["train/grad_norm"], rel=1e-4)
    assert custom["train/loss"] == pytest.approx(6 * builtin["train/loss"], rel=1e-4, abs=1e-7)
    assert custom["train/loss_scale"] == pytest.approx(3.0)  # the hook's own metric, from both ranks
    assert "train/loss_scale" not in builtin
