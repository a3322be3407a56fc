"""Flags of the rollout side: sampling, rollout functions, rewards (evaluation: eval_config.py). Each
flag is declared once, on the field that holds it (lean_rl/options.py); the prompt data flags live with
the buffer (buffer/config.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lean_rl.options import ConfigError, group, option
from lean_rl.rollout.bwrap import TOOL_SANDBOXES
from lean_rl.utils.env_keys import api_key_from_env
from lean_rl.utils.custom_config import CustomConfigFlags

# --rm-type: the rewards of rollout/rewards.py (BUILTIN_REWARDS, which a unit test holds to these names)
BUILTIN_REWARD_TYPES = ("boxed", "exact", "f1", "math", "remote")


# The generate function that drives --environment-path (unless --custom-generate-function-path is given).
MULTI_TURN_GENERATE = "lean_rl.rollout.multi_turn.generate"
VERIFIERS_GENERATE = "lean_rl.rollout.verifiers_env.generate"
VERIFIERS_PROMPTS = "lean_rl.rollout.verifiers_env.prompts"


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = option(1.0, flag="--rollout-temperature")
    top_p: float = option(1.0, flag="--rollout-top-p")
    top_k: int = option(-1, flag="--rollout-top-k")
    max_response_len: int = option(256, flag="--rollout-max-response-len", positive=True)
    stop: tuple[str, ...] = option((), flag="--rollout-stop", help="stop strings")
    stop_token_ids: tuple[int, ...] = option((), flag="--rollout-stop-token-ids")
    ignore_eos: bool = option(False, flag="--rollout-ignore-eos",
                              help="always generate --rollout-max-response-len tokens (benchmarks)")

    def __post_init__(self) -> None:
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--rollout-top-p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            raise ConfigError(f"--rollout-temperature must be >= 0, got {self.temperature}")

    def to_sglang(self, max_new_tokens: int | None = None) -> dict:
        params = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_response_len if max_new_tokens is None else max_new_tokens,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params


@dataclass(frozen=True)
class MultiTurnConfig:
    """Multi-turn rollouts against an environment (lean_rl/rollout/multi_turn.py). The response of a
    trajectory (model turns and observations together) stays within --rollout-max-response-len."""

    environment_path: str | None = option(
        None, help="dotted path of `make_env(cfg, sample) -> Environment` (lean_rl/rollout/environment.py); "
                   "turns on the multi-turn generate")
    max_turns: int = option(8, positive=True, help="model turns per trajectory; past it the sample is truncated")
    max_tokens_per_turn: int | None = option(None, positive=True,
                                             help="cap on one model turn (default: what is left of the response budget)")
    environment_timeout: float = option(60.0, positive=True,
                                        help="seconds one reset/step of the environment may take; past it the sample fails")
    verifiers_env: str | None = option(None, help=(
        "dotted path of a verifiers environment (a vf.Environment, or a function returning one, e.g. a "
        "package's load_environment): its dataset feeds the buffer (unless --prompt-data or --data-source-path), "
        "its own rollout runs against the capture endpoint, its rubric gives the reward "
        "(lean_rl/rollout/verifiers_env.py; pip install -r requirements-envs.txt)"))


@dataclass(frozen=True)
class RolloutConfig:
    rollout_batch_size: int = option(8, positive=True, help="prompts per rollout")  # prompt groups per rollout
    n_samples_per_prompt: int = option(4, positive=True)
    max_concurrency: int = option(64, flag="--rollout-max-concurrency", positive=True,
                                  help="requests in flight at once")
    sampling: SamplingConfig = group(SamplingConfig)
    multi_turn: MultiTurnConfig = group(MultiTurnConfig, title="multi-turn rollouts")
    # Prompt groups launched per rollout (>= rollout_batch_size); None: rollout_batch_size.
    over_sampling_batch_size: int | None = option(
        None, positive=True, help="prompts launched per rollout when a dynamic-sampling filter drops some")
    dynamic_sampling_filter_path: str | None = option(
        None, help="dotted path of `filter(cfg, samples) -> bool`; built-in: lean_rl.rollout.filters.reward_varies")
    partial_rollout: bool = option(False, help=(
        "aborted samples keep their tokens and resume later (--async-mode full always does: implied there)"))
    rollout_function_path: str = option("lean_rl.rollout.default.generate_rollout")
    custom_generate_function_path: str | None = option(
        None, help="dotted path of `async generate(cfg, sample, sampling_params[, evaluation]) -> Sample | list[Sample]`")
    rollout_sample_filter_path: str | None = option(
        None, help="dotted path of `filter(cfg, group) -> list[bool]`: samples it rejects (False) are not trained "
                   "on (their group's statistics still see them)")
    rollout_all_samples_process_path: str | None = option(
        None, help="dotted path of `process(cfg, groups, rollout_id)`, called by the default rollout with every "
                   "group it finished (the filtered-out ones too), e.g. to log or save them")
    rollout_sample_hook_path: tuple[str, ...] = option(
        (), action="append", help="dotted path of slime's `hook(args, sample, *, rollout_id=None, evaluation=False) "
                                  "-> Sample | None`, applied to every generated sample before its reward; repeatable "
                                  "(lean_rl/slime_compat/hooks.py)")
    # --custom-config-path (read into cfg.custom by config.parse_config), in a help section of its own
    custom_config: CustomConfigFlags = group(CustomConfigFlags, title="user functions")
    request_retries: int = option(5, flag="--rollout-request-retries", at_least=0,
                                  help="retries of one /generate call when an engine fails under it")
    blocking_threads: int = option(
        32, flag="--rollout-blocking-threads", positive=True,
        help="threads for blocking user code: environment methods written as plain `def`, and agent code run "
             "with lean_rl.rollout.blocking.run_blocking; a call that hangs holds one of them until it returns, "
             "never a train step, a weight sync nor the process at exit")
    timeout_s: float = option(3600.0, flag="--rollout-timeout", positive=True,
                              help="seconds one rollout (or evaluation) may take, the rollout function's own "
                                   "included; past it the run stops with an error (nothing of that step trained). "
                                   "--async-mode full: the wait for a batch, and each group's generation (a group "
                                   "past it fails and is dropped, counted in rollout/groups_timed_out)")
    tool_sandbox: str = option("bwrap", choices=TOOL_SANDBOXES, help=(
        "what isolates tool code run by lean_rl.rollout.sandbox: bwrap (bubblewrap namespaces; a run whose hooks "
        "use the sandbox refuses to start without it) or none (unisolated, a warning on every call)"))
    # None: no bound (sync modes); k: requeue groups older than k versions.
    max_staleness: int | None = option(None, at_least=0,
                                       help="train only on samples generated at most this many policy versions ago")

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        """An --environment-path runs the multi-turn generate; over-sampling defaults to the batch
        (options.build runs it before the checks)."""
        v = dict(values)
        if v["multi_turn"].environment_path and v["custom_generate_function_path"] is None:
            v["custom_generate_function_path"] = MULTI_TURN_GENERATE
        if v["multi_turn"].verifiers_env and v["custom_generate_function_path"] is None:
            v["custom_generate_function_path"] = VERIFIERS_GENERATE
        if v["over_sampling_batch_size"] is None:
            v["over_sampling_batch_size"] = v["rollout_batch_size"]
        return v

    def __post_init__(self) -> None:
        if self.over_sampling_batch_size is None or self.over_sampling_batch_size < self.rollout_batch_size:
            raise ConfigError(f"--over-sampling-batch-size ({self.over_sampling_batch_size}) must be >= "
                              f"--rollout-batch-size ({self.rollout_batch_size})")

    @property
    def generate_function_flag(self) -> str:
        """The flag that chose the generate function, as an error about it should name it: the one the
        user typed (--environment-path derives the multi-turn generate)."""
        path = self.custom_generate_function_path
        if path is None:
            return "the default generate function"
        if path == MULTI_TURN_GENERATE and self.multi_turn.environment_path:
            return f"--environment-path {self.multi_turn.environment_path} (its generate, {MULTI_TURN_GENERATE})"
        if path == VERIFIERS_GENERATE and self.multi_turn.verifiers_env:
            return f"--verifiers-env {self.multi_turn.verifiers_env} (its generate, {VERIFIERS_GENERATE})"
        return f"--custom-generate-function-path {path}"


@dataclass(frozen=True)
class RewardConfig:
    rm_type: str | None = option(None, choices=BUILTIN_REWARD_TYPES)
    custom_rm_path: str | None = option(None, help="dotted path of `async rm(cfg, sample) -> float | dict[str, float]`")
    reward_key: str | None = option(None, help="the entry of a reward dict that is trained on (the whole dict is "
                                               "kept in sample.metadata['rewards'])")
    custom_reward_post_process_path: str | None = option(
        None, help="dotted path of `post_process(cfg, group) -> list[float]`: the rewards the advantage estimator "
                   "gets (the raw ones are kept in sample.metadata['raw_reward'])")
    group_rm: bool = option(False, help="the reward function scores a whole group at once")
    rm_url: str | None = option(None, help="reward server for --rm-type remote")
    rm_timeout: float = option(30.0, help="seconds per reward call")
    rm_retries: int = option(3)
    # DAPO's over-long shaping of the trained rewards (lean_rl/overlong_shaping.py, algorithms/overlong.py)
    overlong_buffer_len: int | None = option(None, positive=True, help=(
        "DAPO's soft over-long punishment: a response longer than --rollout-max-response-len minus this many tokens "
        "gets a penalty falling linearly to -(--overlong-penalty-factor) at the budget (off unless given)"))
    overlong_penalty_factor: float = option(1.0, help="the largest over-long penalty (with --overlong-buffer-len)")
    overlong_filtering: bool = option(False, help=(
        "DAPO's over-long filtering: samples cut off by the response budget (TRUNCATED) are not trained on; "
        "their rewards still count in their group's statistics"))
    rm_api_key_env: str | None = option(None, metavar="NAME", help=(
        "the environment variable that holds --rm-url's API key, sent as `Authorization: Bearer` to it alone "
        "(the key itself never on the command line)"))

    def __post_init__(self) -> None:
        if self.rm_type == "remote" and not self.rm_url:
            raise ConfigError("--rm-type remote needs --rm-url")
        if self.rm_api_key_env is not None:
            if not self.rm_url:
                raise ConfigError("--rm-api-key-env names the key of --rm-url: add --rm-url URL")
            api_key_from_env(self.rm_api_key_env, "--rm-api-key-env")
        if self.rm_type and self.custom_rm_path:
            raise ConfigError("give either --rm-type or --custom-rm-path, not both")
        if self.overlong_penalty_factor < 0:
            raise ConfigError(f"--overlong-penalty-factor must be >= 0, got {self.overlong_penalty_factor}")
        if self.group_rm and not self.custom_rm_path:
            raise ConfigError("--group-rm needs --custom-rm-path (the built-in rewards score one sample at a time)")
