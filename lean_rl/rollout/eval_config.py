"""Flags of evaluation (--eval-*), and the evaluation sets they describe: one per --eval-prompt-data
pair, or per entry of an --eval-config file (slime's format), each with its own sampling, reward, data
keys and pass@k. Each flag is declared once, on the field that holds it (lean_rl/options.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lean_rl.options import ConfigError, option
from lean_rl.rollout.config import BUILTIN_REWARD_TYPES, SamplingConfig
from lean_rl.rollout.pass_at_k import ks_of


# --eval-config: the per-set settings slime's eval config may give, and where each one lands
EVAL_SET_SAMPLING = ("temperature", "top_p", "top_k", "max_response_len", "stop", "stop_token_ids")  # SamplingConfig's
EVAL_SET_DATA = ("input_key", "label_key", "metadata_key", "tool_key", "apply_chat_template")
EVAL_SET_KEYS = ("name", "path", "n_samples_per_eval_prompt", "rm_type", "custom_rm_path", *EVAL_SET_SAMPLING,
                 *EVAL_SET_DATA, "pass_k")


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set: its prompts, how many samples each, its sampling, its reward (None: the
    run's --rm-type / --custom-rm-path) and the data keys it is read with (None: the run's)."""

    name: str
    path: str
    n_samples_per_prompt: int
    sampling: SamplingConfig
    rm_type: str | None = None
    custom_rm_path: str | None = None
    data_overrides: tuple[tuple[str, Any], ...] = ()  # (DataConfig field, value)
    pass_ks: tuple[int, ...] = ()  # the k's of its pass@k, each <= n_samples_per_prompt; () means 1 and n

    @property
    def ks(self) -> tuple[int, ...]:
        return self.pass_ks or ks_of((), self.n_samples_per_prompt, self.name)


@dataclass(frozen=True)
class EvalConfig:
    datasets: tuple[tuple[str, str], ...] = option(  # (name, path)
        (), flag="--eval-prompt-data", nargs=2, action="append", metavar=("NAME", "PATH"))
    config_path: str | None = option(None, flag="--eval-config", help=(
        "YAML of evaluation sets with settings of their own, slime's format: `eval: {defaults: {...}, datasets: "
        "[{name, path, n_samples_per_eval_prompt, temperature, top_p, top_k, max_response_len, stop, "
        "stop_token_ids, rm_type, custom_rm_path, input_key, label_key, metadata_key, tool_key, "
        "apply_chat_template}, ...]}`; a set's missing keys come from `defaults`, then from the run's flags "
        "(in place of --eval-prompt-data)"))
    interval: int | None = option(None, flag="--eval-interval", positive=True)
    n_samples_per_prompt: int = option(1, flag="--n-samples-per-eval-prompt", positive=True)
    temperature: float | None = option(None, flag="--eval-temperature", help="default: --rollout-temperature")
    top_p: float | None = option(None, flag="--eval-top-p", help="default: --rollout-top-p")
    top_k: int | None = option(None, flag="--eval-top-k", help="default: --rollout-top-k")
    max_response_len: int | None = option(None, flag="--eval-max-response-len", positive=True,
                                          help="default: --rollout-max-response-len")
    function_path: str | None = option(None, flag="--eval-function-path",
                                       help="rollout function of evaluation; default: --rollout-function-path")
    reward_key: str | None = option(None, flag="--eval-reward-key", help="default: --reward-key")
    max_failed_fraction: float = option(0.5, flag="--eval-max-failed-fraction", help=(
        "an evaluation sample whose generation failed (an engine fault past the retries) is counted "
        "(eval/<name>/failed) and scored by no metric; past this fraction of a set the run stops"))
    pass_k: tuple[int, ...] = option((), flag="--eval-pass-k", metavar="K", help=(
        "report eval/<set>/pass@K for each K (1 <= K <= the set's samples per prompt; a set's `pass_k` in "
        "--eval-config wins); default: 1 and the samples per prompt"))
    # Derived once by config.parse_config (with_rollout_sampling): the rollout's sampling with the two eval overrides.
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Derived once by config.parse_config (with_sets): every set, from --eval-prompt-data or --eval-config
    sets: tuple[EvalSet, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.max_failed_fraction <= 1:
            raise ConfigError(f"--eval-max-failed-fraction must be in [0, 1], got {self.max_failed_fraction}")

    def with_rollout_sampling(self, rollout: SamplingConfig) -> "EvalConfig":
        """This config with `sampling` derived from the rollout's: --eval-temperature, --eval-top-p,
        --eval-top-k and --eval-max-response-len override it when given."""
        return dataclasses.replace(self, sampling=dataclasses.replace(
            rollout,
            temperature=rollout.temperature if self.temperature is None else self.temperature,
            top_p=rollout.top_p if self.top_p is None else self.top_p,
            top_k=rollout.top_k if self.top_k is None else self.top_k,
            max_response_len=self.max_response_len or rollout.max_response_len))

    def with_sets(self, eval_config: dict[str, Any] | None) -> "EvalConfig":
        """This config with `sets` (and `datasets`) derived: one set per --eval-prompt-data pair with
        the run's settings, or those of `eval_config` (the --eval-config file, read), each key of a set
        taken from the set, else from its `defaults`, else from the run's flags."""
        if eval_config is None:
            return dataclasses.replace(self, sets=tuple(
                EvalSet(name, path, self.n_samples_per_prompt, self.sampling,
                        pass_ks=ks_of(self.pass_k, self.n_samples_per_prompt, f"--eval-pass-k (set {name})"))
                for name, path in self.datasets))
        where = f"--eval-config {self.config_path}"
        if self.datasets:
            raise ConfigError(f"{where}: give the evaluation sets either there or with --eval-prompt-data, not both")
        body = eval_config.get("eval", eval_config)
        if not isinstance(body, dict) or not isinstance(body.get("datasets"), list) or not body["datasets"]:
            raise ConfigError(f"{where}: expected `eval: {{defaults: {{...}}, datasets: [{{name: ..., path: ...}}, ...]}}`")
        defaults = body.get("defaults") or {}
        sets = []
        for i, entry in enumerate(body["datasets"]):
            if not isinstance(entry, dict) or not entry.get("name") or not entry.get("path"):
                raise ConfigError(f"{where}: datasets[{i}] needs a name and a path, got {entry!r}")
            for key in [*defaults, *entry]:
                if key not in EVAL_SET_KEYS:
                    raise ConfigError(f"{where}: {entry['name'] if key in entry else 'defaults'}: key {key!r} is not "
                                      f"one lean_rl reads; it reads {', '.join(EVAL_SET_KEYS)}")
            given = {**defaults, **entry}
            changes: dict[str, Any] = {key: tuple(given[key]) if isinstance(given[key], list) else given[key]
                                       for key in EVAL_SET_SAMPLING if key in given}
            sampling = dataclasses.replace(self.sampling, **changes)
            if given.get("rm_type") and given.get("custom_rm_path"):
                raise ConfigError(f"{where}: {entry['name']}: give either rm_type or custom_rm_path, not both")
            if given.get("rm_type") and given["rm_type"] not in BUILTIN_REWARD_TYPES:
                raise ConfigError(f"{where}: {entry['name']}: rm_type {given['rm_type']!r}: choose one of "
                                  f"{', '.join(BUILTIN_REWARD_TYPES)}")
            n = int(given.get("n_samples_per_eval_prompt", self.n_samples_per_prompt))
            set_ks = given.get("pass_k")
            ks = ks_of(self.pass_k, n, f"--eval-pass-k (set {entry['name']})") if set_ks is None else \
                ks_of(set_ks if isinstance(set_ks, list) else [set_ks], n, f"{where}: {entry['name']}: pass_k")
            sets.append(EvalSet(
                name=str(entry["name"]), path=str(entry["path"]), n_samples_per_prompt=n,
                sampling=sampling, rm_type=given.get("rm_type"), custom_rm_path=given.get("custom_rm_path"),
                data_overrides=tuple((key, given[key]) for key in EVAL_SET_DATA if key in given), pass_ks=ks))
        names = [s.name for s in sets]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: two sets share a name: {names}")
        return dataclasses.replace(self, sets=tuple(sets), datasets=tuple((s.name, s.path) for s in sets))
