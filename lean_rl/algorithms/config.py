"""Typed, frozen flags of the RL algorithm (advantage estimator, policy loss, KL, entropy, off-policy
correction, aggregation). Each flag is an `option` on its field; built once by
`read_options(AlgorithmConfig, args, max_response_len=...)` (or `options.build`); the values taken
from other flags are computed by `AlgorithmConfig.derive_fields` and nowhere else; `__post_init__` only checks;
invalid values raise ConfigError naming the flag."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lean_rl.algorithms.names import (AGGREGATION_MODES, DPO_LOSS_TYPES, ESTIMATORS, IS_LEVELS, KL_IN_REWARD_ESTIMATORS,
                                     KL_TYPES, LOSS_TYPES, POLICY_LOSSES, RAW_REWARD_ESTIMATORS)
from lean_rl.options import ConfigError, option
from lean_rl.utils.custom_config import ReadOnlyMapping

# What a user of each estimator expects when --loss-agg-mode is not given.
DEFAULT_AGGREGATION = {"dr_grpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean"}
# ... and of each policy loss (before the estimator's): GMPO's objective is a mean over sequences
DEFAULT_POLICY_LOSS_AGGREGATION = {"gmpo": "seq-mean-token-mean"}
# the estimators that name their policy loss (slime's --advantage-estimator gspo / cispo)
ESTIMATOR_POLICY_LOSS = {"gspo": "gspo", "cispo": "cispo"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage_estimator: str = option("grpo", choices=ESTIMATORS, help=(
        "cispo: grpo's advantages with --policy-loss cispo (slime's name); opo: r minus the group's "
        "length-weighted mean reward; remax: r minus the reward of the prompt's greedy (temperature 0) response, "
        "which the rollout generates and scores beside the group, untrained (ReMax; one extra request per prompt); "
        "pass_at_k: Pass@k Training's analytical advantages (0/1 rewards, --pass-k)"))
    pass_k: int | None = option(None, positive=True, help=(
        "k of --advantage-estimator pass_at_k (a group with fewer valid samples uses their number)"))
    policy_loss: str | None = option(None, choices=POLICY_LOSSES, help=(
        "default: gspo / cispo for those estimators, else ppo. cispo: -sg(clip(r)) * A * logp (MiniMax-M1; "
        "--eps-clip >= 1 drops the lower bound); gmpo: -A * exp(mean of the sign-aware clipped token log-ratios), "
        "A the row's mean advantage over its trained tokens (one per sequence, as GMPO defines it), "
        "--eps-clip / --eps-clip-high bound log r (GMPO); kl_cov / clip_cov (Cui et al. 2025): a KL penalty on, "
        "or no gradient for, tokens of high covariance (logp - mean)(A - mean), the means over the "
        "micro-batch's trained tokens; sapo: -A * sigmoid(tau (r - 1)) * 4 / tau, a soft gate instead of the clip "
        "(SAPO)"))
    sapo_tau_pos: float = option(1.0, positive=True, help="sapo: gate temperature for positive advantages")
    sapo_tau_neg: float = option(1.05, positive=True, help="sapo: gate temperature for negative advantages")
    kl_cov_ratio: float = option(0.0002, help="kl_cov: fraction of a micro-batch's trained tokens, those of largest "
                                              "covariance, that get the KL penalty")
    ppo_kl_coef: float = option(1.0, help="kl_cov: weight of the penalty |logp - old logp|")
    clip_cov_ratio: float = option(0.0002, help="clip_cov: fraction of a micro-batch's trained tokens whose "
                                                "gradient is dropped (drawn among the candidates, seeded by the data)")
    clip_cov_lb: float = option(1.0, help="clip_cov: candidates have covariance > this")
    clip_cov_ub: float = option(5.0, help="clip_cov: candidates have covariance < this")
    eps_clip: float = option(0.2, help="PPO clip range (lower side)")
    eps_clip_high: float | None = option(None, help="upper clip range; default --eps-clip")  # None: eps_clip
    eps_clip_c: float | None = option(None, help="dual clip (Ye et al. 2020): for negative advantages the loss is "
                                                 "capped at -c * A; c > 1. Off unless given (verl applies c=3 by default)")
    kl_loss_coef: float = option(0.0, help="KL(policy || reference) loss weight")
    kl_loss_type: str = option("k1", choices=KL_TYPES, help=(
        "estimator of KL(policy || reference), log r = ref - logp: k1 = -log r; k2 = (log r)^2 / 2; "
        "k3 = (r - 1) - log r, unclamped (as slime); low_var_kl = k3 with log r clamped to [-20, 20] "
        "and the result to [-10, 10] (slime's and verl's low_var_kl, verl's k3)"))
    # KL in the reward (REINFORCE++ variants, PPO); always the k1 estimate
    kl_coef: float = option(0.0, help="KL penalty in the reward (reinforce_plus_plus[_baseline], ppo)")
    entropy_coef: float = option(0.0)
    use_tis: bool = option(False, help="truncated importance sampling against the rollout log-probs")
    tis_clip: float = option(2.0, help="upper bound of the TIS weight")
    tis_clip_low: float = option(0.0, help="lower bound of the TIS weight")
    tis_level: str = option("token", choices=IS_LEVELS, help=(
        "TIS ratio per token, per sequence (product of token ratios) or geometric (their geometric mean)"))
    custom_tis_function_path: str | None = option(None, help=(
        "dotted path of slime's `tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, "
        "response_lengths) -> (pg_loss, loss_masks, metrics)` in place of --tis-level's weights (with --use-tis; "
        "lean_rl/algorithms/slime_contracts.py)"))
    use_rs: bool = option(False, help=(
        "rejection sampling (masked IS): tokens or sequences whose engine/trainer ratio leaves "
        "[--rs-lower-bound, --rs-upper-bound] get no gradient"))
    rs_level: str = option("token", choices=IS_LEVELS, help="rejection per token, sequence or geometric mean")
    rs_lower_bound: float | None = option(None, help="default 1 / --rs-upper-bound")
    rs_upper_bound: float = option(2.0)
    decoupled_ppo: bool = option(False, help="AReaL decoupled PPO: clip against the recomputed (proximal) policy, "
                                             "weight by exp(proximal - behaviour) for stale samples")
    behav_imp_weight_cap: float | None = option(None, help="drop tokens whose behaviour weight exceeds this "
                                                           "(decoupled PPO)")
    use_rollout_logprobs: bool = option(  # old policy = the engine's log-probs, no recompute
        False, help="use the engine's log-probs as the old policy instead of recomputing them")
    normalize_advantages: bool = option(False, help="whiten advantages over the batch")
    disable_rewards_normalization: bool = option(False, help=(
        "raw rewards as the sequence advantages of grpo, dr_grpo, gspo, cispo and reinforce_plus_plus_baseline: "
        "no group mean subtracted, no std divided (slime's flag)"))
    loss_agg_mode: str | None = option(  # None: DEFAULT_AGGREGATION, else token-mean
        None, choices=AGGREGATION_MODES,
        help="default: seq-mean-token-mean for --policy-loss gmpo, seq-mean-token-sum-norm for dr_grpo, "
             "seq-mean-token-mean for gspo, else token-mean")
    loss_norm_length: int | None = option(  # the constant of seq-mean-token-sum-norm; None: max_response_len
        None, help="constant of seq-mean-token-sum-norm; default --rollout-max-response-len")
    gamma: float = option(1.0, help="discount (REINFORCE++, PPO)")
    lambd: float = option(1.0, help="GAE lambda (PPO)")
    value_clip: float | None = option(0.2, help="critic value clip (PPO); <= 0 disables",
                                      convert=lambda clip: clip if clip is not None and clip > 0 else None)
    # FAILED samples (engine / router / reward failures) are never trained on; past this share of a
    # rollout the run stops instead (the engines or the reward function are broken)
    max_failed_fraction: float = option(
        0.5, help="stop the run when more than this fraction of a rollout's samples FAILED "
                 "(1: train on whatever did not fail)")
    # user hooks replacing the policy loss (called on every trainer rank) and the advantage estimator
    # (called on the driver); checked at start-up (algorithms/hooks.py, docs/extending.md)
    custom_loss_function_path: str | None = option(
        None, help="dotted path of `loss(algo, **inputs) -> (loss, metrics)` replacing the policy loss "
                   "(inputs as lean_rl.algorithms.losses.policy_loss takes them)")
    loss_type: str | None = option(  # None: custom_loss with --custom-loss-function-path, else policy_loss
        None, choices=LOSS_TYPES, help=(
            "policy_loss: --policy-loss with its KL / entropy terms; sft_loss: supervised fine-tuning, the negative "
            "log-likelihood of the trained tokens (loss mask) of conversations from --prompt-data, no engines "
            "(lean_rl.rollout.sft builds the samples); custom_loss: --custom-loss-function-path (default with it); "
            "dpo_loss: DPO on --prompt-data's preference pairs against the frozen reference (--dpo-loss-type, "
            "--dpo-beta); rm_loss: a reward model (value head) trained on the pairs with the Bradley-Terry loss; "
            "both with no engines (lean_rl.rollout.preference builds the pairs)"))
    custom_advantage_function_path: str | None = option(
        None, help="dotted path of `advantages(algo, inputs: AdvantageInputs) -> advantages | (advantages, returns)` "
                   "replacing --advantage-estimator's advantages")
    # --loss-type dpo_loss (lean_rl/algorithms/preference.py)
    dpo_beta: float = option(0.1, positive=True, help="DPO's beta: the strength of the implicit KL to the reference")
    dpo_loss_type: str = option("sigmoid", choices=DPO_LOSS_TYPES, help=(
        "sigmoid: DPO; hinge: SLiC's max(0, 1 - beta h); ipo: IPO's (h - 1/(2 beta))^2 on length-averaged "
        "log-probs; sigmoid_norm: DPO on length-averaged log-probs"))
    dpo_label_smoothing: float = option(0.0, help="cDPO's label noise eps in [0, 0.5) (--dpo-loss-type sigmoid)")
    # --custom-config-path, read once by config.parse_config: what the trainer-side hooks may read
    custom: Mapping[str, Any] = field(default_factory=ReadOnlyMapping)
    # --slime-argv (set by lean_rl.slime_launch), for the `args` of slime's trainer-side hooks
    slime_argv: str | None = field(default=None, repr=False)
    # derived (see derive_fields): --loss-agg-mode, else the default of the policy loss, else of the estimator
    aggregation: str = ""

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        """The values that default to other flags' (options.build runs it before the checks). Takes
        `max_response_len` (--rollout-max-response-len), the default of --loss-norm-length."""
        v = dict(values)
        max_response_len = v.pop("max_response_len", None)
        if v["loss_type"] is None:
            v["loss_type"] = "custom_loss" if v["custom_loss_function_path"] is not None else "policy_loss"
        if v["loss_norm_length"] is None:
            v["loss_norm_length"] = max_response_len
        implied = ESTIMATOR_POLICY_LOSS.get(v["advantage_estimator"])
        _require(v["policy_loss"] is None or implied is None or v["policy_loss"] == implied,
                 f"--advantage-estimator {v['advantage_estimator']} uses --policy-loss {implied}, "
                 f"got --policy-loss {v['policy_loss']}")
        v["policy_loss"] = v["policy_loss"] or implied or "ppo"
        if v["eps_clip_high"] is None:
            v["eps_clip_high"] = v["eps_clip"]
        if v["rs_lower_bound"] is None:
            v["rs_lower_bound"] = 1 / v["rs_upper_bound"] if v["rs_upper_bound"] > 0 else 0.0
        v["aggregation"] = (v["loss_agg_mode"] or DEFAULT_POLICY_LOSS_AGGREGATION.get(v["policy_loss"])
                            or DEFAULT_AGGREGATION.get(v["advantage_estimator"], "token-mean"))
        return v

    def __post_init__(self) -> None:
        custom = self.custom_loss_function_path is not None
        _require(self.loss_type in LOSS_TYPES, f"--loss-type {self.loss_type!r}: choose one of {', '.join(LOSS_TYPES)}")
        _require(custom == (self.loss_type == "custom_loss"),
                 "--loss-type custom_loss needs --custom-loss-function-path" if not custom else
                 f"--custom-loss-function-path replaces the loss: it needs --loss-type custom_loss, not {self.loss_type}")
        _require(self.advantage_estimator in ESTIMATORS,
                 f"--advantage-estimator {self.advantage_estimator!r}: choose one of {', '.join(ESTIMATORS)}")
        _require(self.policy_loss in POLICY_LOSSES,
                 f"--policy-loss {self.policy_loss!r}: choose one of {', '.join(POLICY_LOSSES)}")
        if self.policy_loss == "cispo":  # a lower bound 1 - eps_clip <= 0 clips nothing (MiniMax-M1's setting)
            _require(self.eps_clip > 0, f"--eps-clip must be > 0, got {self.eps_clip}")
        else:
            _require(0 < self.eps_clip < 1, f"--eps-clip must be in (0, 1), got {self.eps_clip}")
        _require(self.eps_clip_c is None or self.policy_loss in ("ppo", "gspo", "clip_cov"),  # not cispo/gmpo/kl_cov/sapo
                 f"--eps-clip-c (dual clip) applies to --policy-loss ppo, gspo, clip_cov, not {self.policy_loss}")
        _require(self.advantage_estimator != "pass_at_k" or self.pass_k is not None,
                 "--advantage-estimator pass_at_k needs --pass-k")
        _require(not self.disable_rewards_normalization or self.advantage_estimator in RAW_REWARD_ESTIMATORS,
                 f"--disable-rewards-normalization applies to {', '.join(RAW_REWARD_ESTIMATORS)}, "
                 f"not --advantage-estimator {self.advantage_estimator} (which normalizes no group reward)")
        _require(self.pass_k is None or self.pass_k >= 1, f"--pass-k must be >= 1, got {self.pass_k}")
        _require(0 < self.kl_cov_ratio <= 1, f"--kl-cov-ratio must be in (0, 1], got {self.kl_cov_ratio}")
        _require(self.ppo_kl_coef >= 0, f"--ppo-kl-coef must be >= 0, got {self.ppo_kl_coef}")
        _require(0 < self.clip_cov_ratio <= 1, f"--clip-cov-ratio must be in (0, 1], got {self.clip_cov_ratio}")
        _require(self.clip_cov_lb < self.clip_cov_ub,
                 f"--clip-cov-lb ({self.clip_cov_lb}) must be < --clip-cov-ub ({self.clip_cov_ub})")
        _require(self.eps_clip_high is not None and self.eps_clip_high > 0, f"--eps-clip-high must be > 0, got {self.eps_clip_high}")
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
        _require(self.rs_lower_bound is not None and 0 < self.rs_lower_bound < self.rs_upper_bound,
                 f"--rs-lower-bound ({self.rs_lower_bound}) must be > 0 and < --rs-upper-bound ({self.rs_upper_bound})")
        _require(self.custom_tis_function_path is None or self.use_tis,
                 "--custom-tis-function-path replaces the TIS weights: it needs --use-tis")
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
        _require(0 <= self.max_failed_fraction <= 1,
                 f"--max-failed-fraction must be in [0, 1], got {self.max_failed_fraction}")
        _require(self.loss_type not in ("dpo_loss", "rm_loss") or not (self.use_rollout_logprobs or self.needs_critic),
                 f"--loss-type {self.loss_type} trains on given pairs: it has no rollout log-probs "
                 "(--use-rollout-logprobs) and no critic (--advantage-estimator ppo)")
        _require(0 <= self.dpo_label_smoothing < 0.5,
                 f"--dpo-label-smoothing must be in [0, 0.5), got {self.dpo_label_smoothing}")
        _require(self.dpo_label_smoothing == 0 or self.dpo_loss_type in ("sigmoid", "sigmoid_norm"),
                 f"--dpo-label-smoothing applies to --dpo-loss-type sigmoid / sigmoid_norm, not {self.dpo_loss_type}")
        aggregation = self.aggregation
        _require(aggregation in AGGREGATION_MODES,
                 f"--loss-agg-mode {aggregation!r}: choose one of {', '.join(AGGREGATION_MODES)}")
        _require(aggregation != "seq-mean-token-sum-norm" or (self.loss_norm_length or 0) > 0,
                 f"--loss-agg-mode {aggregation} (the default of --advantage-estimator dr_grpo) needs "
                 "--loss-norm-length > 0 (the generation budget, e.g. --rollout-max-response-len)")

    @property
    def needs_reference(self) -> bool:
        return self.kl_loss_coef != 0 or self.kl_coef != 0 or self.loss_type == "dpo_loss"

    @property
    def scores_sequences(self) -> bool:
        """The trained model is a reward model: a value head (hidden -> 1) in place of the vocabulary."""
        return self.loss_type == "rm_loss"

    @property
    def needs_critic(self) -> bool:
        return self.advantage_estimator == "ppo"

    @property
    def needs_rollout_log_probs(self) -> bool:
        return self.use_tis or self.use_rs or self.decoupled_ppo or self.use_rollout_logprobs
