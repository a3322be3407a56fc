"""Typed, frozen flags of the RL algorithm (advantage estimator, policy loss, KL, entropy, off-policy
correction, aggregation). Built once by `algorithm_config_from_args`; derived values are computed in
__post_init__ and nowhere else; invalid values raise ConfigError naming the flag."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from lean_rl.algorithms.advantages import ESTIMATORS, KL_IN_REWARD_ESTIMATORS
from lean_rl.algorithms.kl import KL_TYPES
from lean_rl.algorithms.losses import AGGREGATION_MODES
from lean_rl.backends.megatron.config import ConfigError

# What a user of each estimator expects when --loss-agg-mode is not given.
DEFAULT_AGGREGATION = {"dr_grpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # None: same as eps_clip
    eps_clip_c: float | None = None  # dual-clip bound (> 1) for negative advantages
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    kl_coef: float = 0.0  # KL in the reward (REINFORCE++ variants, PPO); always the k1 estimate
    entropy_coef: float = 0.0
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    decoupled_ppo: bool = False
    behav_imp_weight_cap: float | None = None
    use_rollout_logprobs: bool = False  # old policy = the engine's log-probs, no recompute
    normalize_advantages: bool = False
    loss_agg_mode: str | None = None  # None: DEFAULT_AGGREGATION, else token-mean
    loss_norm_length: int | None = None  # the constant of seq-mean-token-sum-norm
    gamma: float = 1.0
    lambd: float = 1.0
    value_clip: float | None = 0.2
    # derived
    policy_loss: str = field(init=False)  # "ppo" | "gspo"
    aggregation: str = field(init=False)

    def __post_init__(self) -> None:
        _require(self.advantage_estimator in ESTIMATORS,
                 f"--advantage-estimator {self.advantage_estimator!r}: choose one of {', '.join(ESTIMATORS)}")
        _require(0 < self.eps_clip < 1, f"--eps-clip must be in (0, 1), got {self.eps_clip}")
        if self.eps_clip_high is None:
            object.__setattr__(self, "eps_clip_high", self.eps_clip)
        _require(self.eps_clip_high > 0, f"--eps-clip-high must be > 0, got {self.eps_clip_high}")
        _require(self.eps_clip_c is None or self.eps_clip_c > 1,
                 f"--eps-clip-c (dual clip) must be > 1, got {self.eps_clip_c}")
        _require(self.kl_loss_type in KL_TYPES,
                 f"--kl-loss-type {self.kl_loss_type!r}: choose one of {', '.join(KL_TYPES)}")
        _require(self.kl_loss_coef >= 0, f"--kl-loss-coef must be >= 0, got {self.kl_loss_coef}")
        _require(self.kl_coef >= 0, f"--kl-coef must be >= 0, got {self.kl_coef}")
        _require(self.kl_coef == 0 or self.advantage_estimator in KL_IN_REWARD_ESTIMATORS,
                 f"--kl-coef (KL in the reward) applies to {', '.join(KL_IN_REWARD_ESTIMATORS)}; with "
                 f"--advantage-estimator {self.advantage_estimator} use --kl-loss-coef")
        _require(self.tis_clip > 0, f"--tis-clip must be > 0, got {self.tis_clip}")
        _require(0 <= self.tis_clip_low < self.tis_clip,
                 f"--tis-clip-low must be in [0, --tis-clip {self.tis_clip}), got {self.tis_clip_low}")
        _require(not (self.use_tis and self.decoupled_ppo),
                 "--use-tis and --decoupled-ppo are two forms of the same correction; choose one")
        _require(not (self.decoupled_ppo and self.use_rollout_logprobs),
                 "--decoupled-ppo needs the proximal policy recomputed; it cannot take --use-rollout-logprobs")
        _require(self.behav_imp_weight_cap is None or self.behav_imp_weight_cap > 1,
                 f"--behav-imp-weight-cap must be > 1, got {self.behav_imp_weight_cap}")
        _require(self.behav_imp_weight_cap is None or self.decoupled_ppo,
                 "--behav-imp-weight-cap needs --decoupled-ppo")
        _require(0 <= self.gamma <= 1, f"--gamma must be in [0, 1], got {self.gamma}")
        _require(0 <= self.lambd <= 1, f"--lambd must be in [0, 1], got {self.lambd}")
        _require(self.value_clip is None or self.value_clip > 0, f"--value-clip must be > 0, got {self.value_clip}")
        aggregation = self.loss_agg_mode or DEFAULT_AGGREGATION.get(self.advantage_estimator, "token-mean")
        _require(aggregation in AGGREGATION_MODES,
                 f"--loss-agg-mode {aggregation!r}: choose one of {', '.join(AGGREGATION_MODES)}")
        _require(aggregation != "seq-mean-token-sum-norm" or (self.loss_norm_length or 0) > 0,
                 f"--loss-agg-mode {aggregation} (the default of --advantage-estimator dr_grpo) needs "
                 "--loss-norm-length > 0 (the generation budget, e.g. --rollout-max-response-len)")
        object.__setattr__(self, "aggregation", aggregation)
        object.__setattr__(self, "policy_loss", "gspo" if self.advantage_estimator == "gspo" else "ppo")

    @property
    def needs_reference(self) -> bool:
        return self.kl_loss_coef != 0 or self.kl_coef != 0

    @property
    def needs_critic(self) -> bool:
        return self.advantage_estimator == "ppo"

    @property
    def needs_rollout_log_probs(self) -> bool:
        return self.use_tis or self.decoupled_ppo or self.use_rollout_logprobs


def add_algorithm_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("rl algorithm")
    group.add_argument("--advantage-estimator", default="grpo", choices=ESTIMATORS)
    group.add_argument("--eps-clip", type=float, default=0.2, help="PPO clip range (lower side)")
    group.add_argument("--eps-clip-high", type=float, default=None, help="upper clip range; default --eps-clip")
    group.add_argument("--eps-clip-c", type=float, default=None, help="dual-clip bound (> 1) for negative advantages")
    group.add_argument("--kl-loss-coef", type=float, default=0.0, help="KL(policy || reference) loss weight")
    group.add_argument("--kl-loss-type", default="k1", choices=KL_TYPES)
    group.add_argument("--kl-coef", type=float, default=0.0,
                       help="KL penalty in the reward (reinforce_plus_plus[_baseline], ppo)")
    group.add_argument("--entropy-coef", type=float, default=0.0)
    group.add_argument("--use-tis", action="store_true",
                       help="truncated importance sampling against the rollout log-probs")
    group.add_argument("--tis-clip", type=float, default=2.0)
    group.add_argument("--tis-clip-low", type=float, default=0.0)
    group.add_argument("--decoupled-ppo", action="store_true",
                       help="AReaL decoupled PPO: clip against the recomputed (proximal) policy, weight by "
                            "exp(proximal - behaviour) for stale samples")
    group.add_argument("--behav-imp-weight-cap", type=float, default=None,
                       help="drop tokens whose behaviour weight exceeds this (decoupled PPO)")
    group.add_argument("--use-rollout-logprobs", action="store_true",
                       help="use the engine's log-probs as the old policy instead of recomputing them")
    group.add_argument("--normalize-advantages", action="store_true", help="whiten advantages over the batch")
    group.add_argument("--loss-agg-mode", default=None, choices=AGGREGATION_MODES,
                       help="default: seq-mean-token-sum-norm for dr_grpo, seq-mean-token-mean for gspo, "
                            "else token-mean")
    group.add_argument("--loss-norm-length", type=int, default=None,
                       help="constant of seq-mean-token-sum-norm; default --rollout-max-response-len")
    group.add_argument("--gamma", type=float, default=1.0, help="discount (REINFORCE++, PPO)")
    group.add_argument("--lambd", type=float, default=1.0, help="GAE lambda (PPO)")
    group.add_argument("--value-clip", type=float, default=0.2, help="critic value clip (PPO); <= 0 disables")
    return parser


def algorithm_config_from_args(args: argparse.Namespace) -> AlgorithmConfig:
    norm_length = args.loss_norm_length
    if norm_length is None:
        norm_length = getattr(args, "rollout_max_response_len", None)
    return AlgorithmConfig(
        advantage_estimator=args.advantage_estimator, eps_clip=args.eps_clip, eps_clip_high=args.eps_clip_high,
        eps_clip_c=args.eps_clip_c, kl_loss_coef=args.kl_loss_coef, kl_loss_type=args.kl_loss_type,
        kl_coef=args.kl_coef, entropy_coef=args.entropy_coef, use_tis=args.use_tis, tis_clip=args.tis_clip,
        tis_clip_low=args.tis_clip_low, decoupled_ppo=args.decoupled_ppo,
        behav_imp_weight_cap=args.behav_imp_weight_cap, use_rollout_logprobs=args.use_rollout_logprobs,
        normalize_advantages=args.normalize_advantages, loss_agg_mode=args.loss_agg_mode,
        loss_norm_length=norm_length, gamma=args.gamma, lambd=args.lambd,
        value_clip=args.value_clip if args.value_clip is not None and args.value_clip > 0 else None)
