"""The trainer-side user hooks (docs/extending.md): --custom-advantage-function-path replaces the
advantage estimator (called once per rollout on the driver) and --custom-loss-function-path the policy
loss (called per micro-batch on every trainer rank). Both get the AlgorithmConfig (`algo`, with the
--custom-config-path settings as `algo.custom`), as the built-ins do: the ranks never hold the whole
run Config. Loaded and checked here, at start-up in the driver (lean_rl/extensions.py load_extensions) and
again where they are called; what they return is checked on every call."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import torch

# AdvantageInputs lives with its estimator (advantages.py); users import it from here too (docs/extending.md)
from lean_rl.algorithms.advantages import AdvantageInputs, compute_advantages
from lean_rl.algorithms.token_returns import broadcast
from lean_rl.algorithms.losses import policy_loss, sft_loss
from lean_rl.algorithms.names import PAIRWISE_LOSS_TYPES
from lean_rl.algorithms.preference import pairwise_loss
from lean_rl.algorithms.slime_contracts import slime_advantages, slime_loss
from lean_rl.utils.plugins import hook_return_error, import_object, is_slime_function, load_function

if TYPE_CHECKING:
    from lean_rl.algorithms.config import AlgorithmConfig

LOSS_FLAG = "--custom-loss-function-path"
ADVANTAGE_FLAG = "--custom-advantage-function-path"
# The keyword arguments of a policy loss (lean_rl.algorithms.losses.policy_loss takes exactly these)
LOSS_INPUTS = ("log_probs", "advantages", "mask", "weights", "metric_weights", "old_log_probs", "ref_log_probs",
               "rollout_log_probs", "entropy")


# ---------------------------------------------------------------- advantages
def builtin_advantages(algo: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """--advantage-estimator's (advantages [B, T], returns [B, T] or None): what runs without the hook,
    and what a custom function may start from."""
    return compute_advantages(
        algo.advantage_estimator, inputs.rewards, inputs.group_ids, inputs.mask, valid=inputs.valid, kl=inputs.kl,
        kl_coef=algo.kl_coef, values=inputs.values, gamma=algo.gamma, lam=algo.lambd,
        normalize=algo.normalize_advantages, pass_k=algo.pass_k, baselines=inputs.baseline_rewards,
        group_baseline=not algo.disable_rewards_normalization)


def load_advantage_function(path: str) -> Callable:
    return load_function(path, ADVANTAGE_FLAG, num_args=2, must_be_sync=True)


def advantage_function(algo: AlgorithmConfig) -> Callable:
    """The hook named by the flag, or the built-in estimator."""
    path = algo.custom_advantage_function_path
    return _cached_advantage_function(path) if path else builtin_advantages


@functools.lru_cache(maxsize=8)
def _cached_advantage_function(path: str) -> Callable:
    return load_advantage_function(path)


def compute_custom_or_builtin_advantages(algo: AlgorithmConfig, inputs: AdvantageInputs
                                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages [B, T], returns or None), from the hook (checked, see checked_advantages) or the
    built-in estimator."""
    fn = advantage_function(algo)
    if fn is builtin_advantages:
        return builtin_advantages(algo, inputs)
    if is_slime_function(fn):  # slime's contract: f(args, rollout_data) fills rollout_data (slime_contracts.py)
        result = slime_advantages(fn, algo, inputs, f"{ADVANTAGE_FLAG} {algo.custom_advantage_function_path}")
        return checked_advantages(algo, fn, result, inputs.mask)
    return checked_advantages(algo, fn, fn(algo, inputs), inputs.mask)


def checked_advantages(algo: AlgorithmConfig, fn: Callable, result, mask: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A custom advantage function's result: a tensor [B, T] (or [B]: one advantage per sequence,
    spread over its trained tokens), or (advantages, returns) with returns [B, T] or None (PPO needs
    them for its critic). 0 is set wherever `mask` is 0 (padding, tool tokens, FAILED samples)."""
    flag = f"{ADVANTAGE_FLAG} {algo.custom_advantage_function_path}"
    shape = tuple(mask.shape)
    expected = (f"a tensor of advantages shaped [B, T] = {list(shape)} (or [B] = [{shape[0]}]), or a pair "
                "(advantages, returns)")
    advantages, returns = (result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None))
    if not isinstance(advantages, torch.Tensor) or (returns is not None and not isinstance(returns, torch.Tensor)):
        raise hook_return_error(flag, fn, result, expected)
    if tuple(advantages.shape) == shape[:1]:
        advantages = broadcast(advantages, mask)
    if tuple(advantages.shape) != shape or (returns is not None and tuple(returns.shape) != shape):
        raise hook_return_error(flag, fn, result, f"{expected}; got shape {list(advantages.shape)}"
                                + (f" and returns {list(returns.shape)}" if returns is not None else ""))
    if algo.needs_critic and returns is None:
        raise hook_return_error(flag, fn, result, f"{expected}: with --advantage-estimator ppo the pair "
                                "(advantages, returns), returns being the critic's targets")
    trained = mask > 0
    advantages = torch.where(trained, advantages.detach().float(), 0.0)
    if returns is not None:
        returns = torch.where(trained, returns.detach().float(), 0.0)
    return advantages, returns


# ---------------------------------------------------------------- the policy loss
def load_loss_function(path: str) -> Callable:
    """lean_rl's loss, or slime's when its module imports slime (f(args, batch, logits, sum_of_sample_mean),
    served through algorithms/slime_contracts.py), as every hook's contract is chosen."""
    if is_slime_function(import_object(path, LOSS_FLAG)):
        return slime_loss(load_function(path, LOSS_FLAG, num_args=4, must_be_sync=True), path)
    return load_function(path, LOSS_FLAG, num_args=1, must_be_sync=True, keywords=LOSS_INPUTS)


def loss_function(algo: AlgorithmConfig) -> Callable:
    """The hook named by the flag (imported on the rank that calls this), the SFT loss (--loss-type
    sft_loss), the pair losses' (dpo_loss, rm_loss: algorithms/preference.py), or the built-in policy loss."""
    path = algo.custom_loss_function_path
    if path:
        return _checked_loss(path)
    if algo.loss_type in PAIRWISE_LOSS_TYPES:
        return pairwise_loss
    return sft_loss if algo.loss_type == "sft_loss" else policy_loss


@functools.lru_cache(maxsize=8)
def _checked_loss(path: str) -> Callable:
    fn = load_loss_function(path)

    @functools.wraps(fn)
    def call(algo, **inputs):
        return checked_loss(path, fn, fn(algo, **inputs))

    return call


def checked_loss(path: str, fn: Callable, result) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A custom loss's result: (loss, metrics): the loss a 0-d tensor that carries the gradient;
    metrics a dict of name -> scalar (a tensor or a number), each already weighted as the built-in's
    (sum(metric_weights * x)), so that summing over micro-batches and ranks gives the step's mean."""
    expected = "a pair (loss: a 0-d tensor with a gradient, metrics: dict[str, scalar tensor or number])"
    flag = f"{LOSS_FLAG} {path}"
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise hook_return_error(flag, fn, result, expected)
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not isinstance(metrics, dict):
        raise hook_return_error(flag, fn, result, expected)
    if not loss.requires_grad:
        raise hook_return_error(flag, fn, result, f"{expected}; this loss carries no gradient (was it detached, "
                                "or computed under torch.no_grad?)")
    out = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[name] = value.detach().reshape(())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = torch.tensor(float(value))
        else:
            raise hook_return_error(flag, fn, result, f"{expected}; metric {name!r} is not a scalar")
    return loss.reshape(()), out
