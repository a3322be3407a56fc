"""Typed configuration of the rollout side: prompt data, sampling, rewards, evaluation.

Each group is a frozen dataclass built once from parsed flags by `rollout_configs_from_args`; values
derived from several flags are computed there and nowhere else.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from lean_rl.rollout.rewards import BUILTIN_REWARDS


@dataclass(frozen=True)
class DataConfig:
    prompt_data: str | None
    input_key: str = "prompt"
    label_key: str | None = "label"
    metadata_key: str | None = None
    tool_key: str | None = None
    apply_chat_template: bool = False
    rollout_shuffle: bool = False
    seed: int = 42
    num_epochs: int | None = None  # None: as many as the run needs
    rollout_max_prompt_len: int | None = None
    skip_bad_rows: bool = False


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_len: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

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
class RolloutConfig:
    rollout_batch_size: int  # prompt groups per rollout
    n_samples_per_prompt: int
    max_concurrency: int
    sampling: SamplingConfig
    over_sampling_batch_size: int  # prompt groups launched per rollout (>= rollout_batch_size)
    dynamic_sampling_filter_path: str | None
    partial_rollout: bool
    rollout_function_path: str
    custom_generate_function_path: str | None
    max_staleness: int | None  # None: no bound (sync modes); k: requeue groups older than k versions
    request_retries: int = 5  # per /generate call, when an engine fails under it


@dataclass(frozen=True)
class RewardConfig:
    rm_type: str | None
    custom_rm_path: str | None
    group_rm: bool
    rm_url: str | None
    rm_timeout: float
    rm_retries: int


@dataclass(frozen=True)
class EvalConfig:
    datasets: tuple[tuple[str, str], ...] = ()  # (name, path)
    interval: int | None = None
    n_samples_per_prompt: int = 1
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


def add_rollout_args(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("prompt data")
    data.add_argument("--prompt-data", help="jsonl or parquet file of prompts")
    data.add_argument("--input-key", default="prompt", help="column with the prompt: text or a list of chat messages")
    data.add_argument("--label-key", default="label", help="column with the reference answer ('' for none)")
    data.add_argument("--metadata-key", default=None, help="column with a dict passed through to samples")
    data.add_argument("--tool-key", default=None, help="column with tool definitions for the chat template")
    data.add_argument("--apply-chat-template", action="store_true", help="render prompts with the tokenizer's chat template")
    data.add_argument("--rollout-shuffle", action="store_true", help="shuffle prompts every epoch (seeded by --seed)")
    data.add_argument("--seed", type=int, default=42)
    data.add_argument("--num-epochs", type=int, default=None)
    data.add_argument("--rollout-max-prompt-len", type=int, default=None, help="skip (and count) longer prompts")
    data.add_argument("--skip-bad-rows", action="store_true", help="skip and count malformed rows instead of failing")

    rollout = parser.add_argument_group("rollout")
    rollout.add_argument("--rollout-batch-size", type=int, default=8, help="prompts per rollout")
    rollout.add_argument("--n-samples-per-prompt", type=int, default=4)
    rollout.add_argument("--rollout-max-concurrency", type=int, default=64, help="requests in flight at once")
    rollout.add_argument("--rollout-temperature", type=float, default=1.0)
    rollout.add_argument("--rollout-top-p", type=float, default=1.0)
    rollout.add_argument("--rollout-top-k", type=int, default=-1)
    rollout.add_argument("--rollout-max-response-len", type=int, default=256)
    rollout.add_argument("--rollout-stop", nargs="*", default=[], help="stop strings")
    rollout.add_argument("--rollout-stop-token-ids", nargs="*", type=int, default=[])
    rollout.add_argument("--rollout-ignore-eos", action="store_true",
                         help="always generate --rollout-max-response-len tokens (benchmarks)")
    rollout.add_argument("--over-sampling-batch-size", type=int, default=None,
                         help="prompts launched per rollout when a dynamic-sampling filter drops some")
    rollout.add_argument("--dynamic-sampling-filter-path", default=None,
                         help="dotted path of `filter(cfg, samples) -> bool`; built-in: "
                              "lean_rl.rollout.filters.reward_varies")
    rollout.add_argument("--partial-rollout", action="store_true", help="aborted samples keep their tokens and resume later")
    rollout.add_argument("--rollout-function-path", default="lean_rl.rollout.default.generate_rollout")
    rollout.add_argument("--custom-generate-function-path", default=None,
                         help="dotted path of `async generate(cfg, sample, sampling_params) -> Sample | list[Sample]`")
    rollout.add_argument("--rollout-request-retries", type=int, default=5,
                         help="retries of one /generate call when an engine fails under it")
    rollout.add_argument("--max-staleness", type=int, default=None,
                         help="train only on samples generated at most this many policy versions ago")

    reward = parser.add_argument_group("reward")
    reward.add_argument("--rm-type", choices=sorted(BUILTIN_REWARDS), default=None)
    reward.add_argument("--custom-rm-path", default=None, help="dotted path of `async rm(cfg, sample) -> float`")
    reward.add_argument("--group-rm", action="store_true", help="the reward function scores a whole group at once")
    reward.add_argument("--rm-url", default=None, help="reward server for --rm-type remote")
    reward.add_argument("--rm-timeout", type=float, default=30.0, help="seconds per reward call")
    reward.add_argument("--rm-retries", type=int, default=3)

    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument("--eval-prompt-data", nargs=2, action="append", metavar=("NAME", "PATH"), default=[])
    evaluation.add_argument("--eval-interval", type=int, default=None)
    evaluation.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    evaluation.add_argument("--eval-temperature", type=float, default=None, help="default: --rollout-temperature")
    evaluation.add_argument("--eval-max-response-len", type=int, default=None, help="default: --rollout-max-response-len")


def _positive(value, flag: str) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{flag} must be > 0, got {value}")


def rollout_configs_from_args(args: argparse.Namespace) -> tuple[DataConfig, RolloutConfig, RewardConfig, EvalConfig]:
    for flag in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_concurrency", "rollout_max_response_len",
                 "over_sampling_batch_size", "rollout_max_prompt_len", "num_epochs", "eval_interval",
                 "n_samples_per_eval_prompt"):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    if args.rollout_request_retries < 0:
        raise ValueError(f"--rollout-request-retries must be >= 0, got {args.rollout_request_retries}")
    if args.max_staleness is not None and args.max_staleness < 0:
        raise ValueError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if not 0 < args.rollout_top_p <= 1:
        raise ValueError(f"--rollout-top-p must be in (0, 1], got {args.rollout_top_p}")
    if args.rollout_temperature < 0:
        raise ValueError(f"--rollout-temperature must be >= 0, got {args.rollout_temperature}")
    over = args.over_sampling_batch_size or args.rollout_batch_size
    if over < args.rollout_batch_size:
        raise ValueError(f"--over-sampling-batch-size ({over}) must be >= --rollout-batch-size ({args.rollout_batch_size})")
    if args.rm_type == "remote" and not args.rm_url:
        raise ValueError("--rm-type remote needs --rm-url")
    if args.rm_type and args.custom_rm_path:
        raise ValueError("give either --rm-type or --custom-rm-path, not both")
    if args.group_rm and not args.custom_rm_path:
        raise ValueError("--group-rm needs --custom-rm-path (the built-in rewards score one sample at a time)")
    for path_flag, path in [("--prompt-data", args.prompt_data)] + [
        (f"--eval-prompt-data {name}", p) for name, p in args.eval_prompt_data
    ]:
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{path_flag}: file {path!r} does not exist")

    sampling = SamplingConfig(
        temperature=args.rollout_temperature,
        top_p=args.rollout_top_p,
        top_k=args.rollout_top_k,
        max_response_len=args.rollout_max_response_len,
        stop=tuple(args.rollout_stop),
        stop_token_ids=tuple(args.rollout_stop_token_ids),
        ignore_eos=args.rollout_ignore_eos,
    )
    data = DataConfig(
        prompt_data=args.prompt_data,
        input_key=args.input_key,
        label_key=args.label_key or None,
        metadata_key=args.metadata_key,
        tool_key=args.tool_key,
        apply_chat_template=args.apply_chat_template,
        rollout_shuffle=args.rollout_shuffle,
        seed=args.seed,
        num_epochs=args.num_epochs,
        rollout_max_prompt_len=args.rollout_max_prompt_len,
        skip_bad_rows=args.skip_bad_rows,
    )
    rollout = RolloutConfig(
        rollout_batch_size=args.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt,
        max_concurrency=args.rollout_max_concurrency,
        sampling=sampling,
        over_sampling_batch_size=over,
        dynamic_sampling_filter_path=args.dynamic_sampling_filter_path,
        partial_rollout=args.partial_rollout,
        rollout_function_path=args.rollout_function_path,
        custom_generate_function_path=args.custom_generate_function_path,
        max_staleness=args.max_staleness,
        request_retries=args.rollout_request_retries,
    )
    reward = RewardConfig(
        rm_type=args.rm_type,
        custom_rm_path=args.custom_rm_path,
        group_rm=args.group_rm,
        rm_url=args.rm_url,
        rm_timeout=args.rm_timeout,
        rm_retries=args.rm_retries,
    )
    evaluation = EvalConfig(
        datasets=tuple((name, path) for name, path in args.eval_prompt_data),
        interval=args.eval_interval,
        n_samples_per_prompt=args.n_samples_per_eval_prompt,
        sampling=dataclasses.replace(
            sampling,
            temperature=sampling.temperature if args.eval_temperature is None else args.eval_temperature,
            max_response_len=args.eval_max_response_len or sampling.max_response_len,
        ),
    )
    return data, rollout, reward, evaluation
