"""slime's contracts for the trainer-side hooks, on lean_rl's tensors.

lean_rl's estimator and loss see a rollout as [B, T] tensors, each row one response from column 0;
slime's hooks see lists of per-sample tensors (one per response) and packed (concatenated) tokens:

  --custom-advantage-function-path   f(args, rollout_data) sets rollout_data["advantages"] and
                                     ["returns"] (lists, one tensor per sample); rollout_data holds
                                     rewards, log_probs, rollout_log_probs, ref_log_probs, values, kl,
                                     loss_masks, response_lengths, total_lengths
  --custom-tis-function-path         f(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks,
                                     total_lengths, response_lengths) -> (pg_loss, loss_masks, metrics),
                                     pg_loss and each metric packed over the micro-batch's responses

  --custom-loss-function-path        f(args, batch, logits, sum_of_sample_mean) -> (loss, log_dict): batch
                                     holds per-sample lists (advantages, log_probs, ref_log_probs,
                                     rollout_log_probs, loss_masks, response_lengths); `logits` is the
                                     trainer's output as slime's get_log_probs_and_entropy reads it
                                     (TrainerLogits: the log-probs and entropy lean_rl's trainer computed,
                                     vocab-parallel and at the rollout temperature); sum_of_sample_mean
                                     reduces packed tokens with --loss-agg-mode's weights

`args` here is slime's namespace (every attribute slime's parser defines: lean_rl/slime_namespace.py;
launched by lean_rl.slime_launch, the values of its slime command line) with the algorithm's flags
(args.tis_clip, args.kl_coef, args.gamma ...) and the --custom-config-path keys: the trainer ranks hold
the algorithm's config, not the whole run's. A hook counts as slime's when its module imports slime
(lean_rl.utils.plugins.is_slime_function); --custom-tis-function-path has only slime's contract."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any, Callable, overload

import torch
import torch.nn.functional as F

from lean_rl.options import set_flag_values
from lean_rl.slime_namespace import slime_view
from lean_rl.utils.plugins import hook_return_error, load_function

if TYPE_CHECKING:
    from lean_rl.algorithms.config import AlgorithmConfig
    from lean_rl.algorithms.advantages import AdvantageInputs

TIS_FLAG = "--custom-tis-function-path"
TIS_INPUTS = ("pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "total_lengths", "response_lengths")


def algorithm_args(algo: AlgorithmConfig) -> argparse.Namespace:
    """The `args` a slime trainer-side hook reads (a fresh namespace per call: the ranks share none):
    slime's namespace (lean_rl/slime_namespace.py) with the algorithm's flags."""
    args = slime_view(algo.slime_argv, set_flag_values(argparse.Namespace(), algo))
    for key, value in dict(algo.custom).items():  # --custom-config-path: slime sets each key on args
        setattr(args, key, value)
    return args


@overload
def per_sample(x: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]: ...
@overload
def per_sample(x: None, lengths: list[int]) -> None: ...
@overload
def per_sample(x: torch.Tensor | None, lengths: list[int]) -> list[torch.Tensor] | None: ...


def per_sample(x: torch.Tensor | None, lengths: list[int]) -> list[torch.Tensor] | None:
    """Row i of [B, T] cut to its response: lengths[i] values (None stays None: an input the step lacks)."""
    return None if x is None else [x[i, :n] for i, n in enumerate(lengths)]


def padded(values: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Per-sample tensors back into [B, T] (zeros past each one's end)."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for i, v in enumerate(values):
        out[i, :v.numel()] = v.reshape(-1).to(out.dtype)
    return out


def trained_lengths(mask: torch.Tensor) -> list[int]:
    """Each row's length up to its last trained token (what follows is padding, or untrained tokens
    no loss term reads): a micro-batch carries no response lengths of its own."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return [int(n) for n in ((mask > 0) * positions).amax(dim=1)]


# ---------------------------------------------------------------- advantages
def slime_advantages(fn: Callable, algo: AlgorithmConfig, inputs: AdvantageInputs, flag: str):
    """(advantages [B, T], returns [B, T]) from a slime advantage function."""
    if inputs.response_lengths is None or inputs.total_lengths is None:
        raise ValueError(f"{flag}: slime's contract needs the response and total lengths of the rollout")
    lengths = [int(n) for n in inputs.response_lengths]
    policy = inputs.old_log_probs if inputs.old_log_probs is not None else inputs.rollout_log_probs
    kl = inputs.kl if inputs.kl is not None else torch.zeros_like(inputs.mask)
    rollout_data: dict[str, Any] = {
        "rewards": inputs.rewards.tolist(), "log_probs": per_sample(policy, lengths),
        "rollout_log_probs": per_sample(inputs.rollout_log_probs, lengths),
        "ref_log_probs": per_sample(inputs.ref_log_probs, lengths), "values": per_sample(inputs.values, lengths),
        "kl": per_sample(kl, lengths), "loss_masks": per_sample(inputs.mask, lengths), "response_lengths": lengths,
        "total_lengths": [int(n) for n in inputs.total_lengths]}
    fn(algorithm_args(algo), rollout_data)
    advantages, returns = rollout_data.get("advantages"), rollout_data.get("returns")
    expected = (f"nothing, having set rollout_data['advantages'] and rollout_data['returns'] to lists of {len(lengths)} "
                "tensors (one per sample, its response length)")
    for name, value in (("advantages", advantages), ("returns", returns)):
        if not (isinstance(value, list) and len(value) == len(lengths)
                and all(isinstance(v, torch.Tensor) and v.numel() == n for v, n in zip(value, lengths))):
            raise hook_return_error(flag, fn, {name: value}, expected)
    assert isinstance(advantages, list) and isinstance(returns, list)  # checked above
    return padded(advantages, inputs.mask), padded(returns, inputs.mask)


# ---------------------------------------------------------------- truncated importance sampling
def load_tis_function(path: str) -> Callable:
    return load_function(path, TIS_FLAG, num_args=1, must_be_sync=True, keywords=TIS_INPUTS)


@functools.lru_cache(maxsize=8)
def tis_function(path: str) -> Callable:
    """The hook, imported once per process (each trainer rank)."""
    return load_tis_function(path)


def custom_tis(algo: AlgorithmConfig, pg: torch.Tensor, old: torch.Tensor, rollout_log_probs: torch.Tensor,
               mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(pg [B, T] weighted by the hook, its loss mask [B, T], its metrics [B, T]). The mask only
    removes tokens from the loss (slime: the numerator; the normalizer stays the rollout's)."""
    path = algo.custom_tis_function_path
    assert path is not None
    fn = tis_function(path)
    lengths = trained_lengths(mask)
    result = fn(algorithm_args(algo), pg_loss=torch.cat(per_sample(pg, lengths)),
                train_log_probs=per_sample(old.detach(), lengths), rollout_log_probs=per_sample(rollout_log_probs, lengths),
                loss_masks=per_sample(mask, lengths), total_lengths=lengths, response_lengths=lengths)
    total = sum(lengths)
    expected = (f"(pg_loss: a tensor of the {total} packed response tokens, loss_masks: a list of {len(lengths)} tensors, "
                "metrics: dict[str, tensor of the packed tokens])")
    if not (isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], torch.Tensor)
            and result[0].numel() == total and isinstance(result[1], list) and len(result[1]) == len(lengths)
            and isinstance(result[2], dict)):
        raise hook_return_error(f"{TIS_FLAG} {path}", fn, result, expected)
    new_pg, masks, metrics = result
    width = mask.shape[1]
    out_metrics = {}
    for name, value in metrics.items():
        if not (isinstance(value, torch.Tensor) and value.numel() == total):
            raise hook_return_error(f"{TIS_FLAG} {path}", fn, result, f"{expected}; metric {name!r} is not")
        out_metrics[name] = unpacked(value.detach().float(), lengths, width)
    return unpacked(new_pg, lengths, width), padded(masks, mask) * mask, out_metrics


# ---------------------------------------------------------------- the policy loss
class TrainerLogits:
    """What a slime loss gets as `logits`: the per-sample response log-probs (and entropy) that the
    trainer computed from its vocab-parallel output; slime.backends.megatron_utils.loss.
    get_log_probs_and_entropy (lean_rl/slime_compat/megatron_loss.py) hands them out."""

    def __init__(self, log_probs: list[torch.Tensor], entropy: list[torch.Tensor] | None):
        self.log_probs, self.entropy = log_probs, entropy


def unpacked(x: torch.Tensor, lengths: list[int], width: int) -> torch.Tensor:
    """Packed response tokens [sum(lengths)] -> [B, width], zero-padded, keeping the gradient."""
    pieces = torch.split(x.reshape(-1), lengths)
    return torch.stack([F.pad(piece, (0, width - piece.numel())) for piece in pieces])


def slime_loss(fn: Callable, path: str) -> Callable:
    """A slime loss as lean_rl's: (algo, **inputs) -> (loss, metrics)."""

    def call(algo: AlgorithmConfig, *, log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             weights: torch.Tensor, metric_weights: torch.Tensor, old_log_probs: torch.Tensor | None = None,
             ref_log_probs: torch.Tensor | None = None, rollout_log_probs: torch.Tensor | None = None,
             entropy: torch.Tensor | None = None):
        lengths = trained_lengths(mask)
        old = log_probs.detach() if old_log_probs is None else old_log_probs
        batch = {"advantages": per_sample(advantages, lengths), "log_probs": per_sample(old, lengths),
                 "ref_log_probs": per_sample(ref_log_probs, lengths),
                 "rollout_log_probs": per_sample(rollout_log_probs, lengths),
                 "loss_masks": per_sample(mask.float(), lengths), "response_lengths": lengths, "total_lengths": lengths,
                 "unconcat_tokens": None}  # read by get_log_probs_and_entropy in slime; TrainerLogits needs none
        logits = TrainerLogits(per_sample(log_probs, lengths), per_sample(entropy, lengths))

        def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
            return (weights * unpacked(x, lengths, mask.shape[1])).sum()

        result = fn(algorithm_args(algo), batch, logits, sum_of_sample_mean)
        expected = "(loss: a 0-d tensor, log: dict[str, scalar])"
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            raise hook_return_error(f"--custom-loss-function-path {path}", fn, result, expected)
        loss, log = result
        return loss, {name: value.detach() if isinstance(value, torch.Tensor) else value for name, value in log.items()}

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__name__ = getattr(fn, "__name__", "loss")
    return call
