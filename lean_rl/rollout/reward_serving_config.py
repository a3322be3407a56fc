"""Flags of the rewarders this run serves or calls beside the rule rewards: a reward model on engines
of its own (--rm-hf-checkpoint), an LLM judge (--judge-hf-checkpoint / --judge-url) and per-sample
routing to rewarders (--reward-routes). The config layer of rollout/reward_model.py, judge.py and
reward_routing.py, importable without them (lean_rl.config loads only configs)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.live_endpoints import LiveEndpoints
from lean_rl.backends.sglang.ports_and_key import resolve_ports
from lean_rl.options import ConfigError, option, rebuild
from lean_rl.utils.env_keys import api_key_from_env

# HF sequence-classification classes that SGLang 0.5.23 serves as reward models (scores from
# /classify, one per label): sglang/srt/configs/model_config.py is_generation_model lists them among
# the non-generative architectures, and sglang/srt/models/ has their implementations. Qwen2 / Qwen3
# ForSequenceClassification need the patch of backends/sglang/reward_compat.py (a bias HF lacks).
REWARD_MODEL_CLASSES = ("LlamaForSequenceClassification", "Qwen2ForSequenceClassification",
                        "Qwen3ForSequenceClassification", "Gemma2ForSequenceClassification",
                        "Qwen2ForRewardModel", "Qwen3ForRewardModel", "InternLM2ForRewardModel")
JUDGE_BUILTINS = ("score_0_10", "a_or_b")  # rollout/judge.py: a template and a parser of each name


@dataclass(frozen=True)
class RewardServingConfig:
    rm_hf_checkpoint: str | None = option(None, metavar="DIR", help=(
        "HF checkpoint of a sequence-classification reward model (" + ", ".join(REWARD_MODEL_CLASSES) + "), "
        "served by SGLang engines this run starts (their own servers, no weight updates): each finished sample's "
        "prompt + response is scored, label 0's score is the reward (without --rm-type / --custom-rm-path / "
        "--reward-routes; a custom reward gets it from lean_rl.rollout.reward_model.reward_model_score)"))
    rm_num_engines: int | None = option(None, positive=True, help=(
        "SGLang servers for --rm-hf-checkpoint (default 1; on CPU they share the cores with the policy's)"))
    judge_hf_checkpoint: str | None = option(None, metavar="DIR", help=(
        "HF checkpoint of a generative LLM judge, served by SGLang engines this run starts; each finished sample is "
        "put to it with --judge-template and its answer read by --judge-parser"))
    judge_url: str | None = option(None, metavar="URL", help=(
        "instead of --judge-hf-checkpoint: an OpenAI-compatible server of yours (/v1/chat/completions; its key: "
        "--judge-api-key-env)"))
    judge_num_engines: int | None = option(None, positive=True, help="SGLang servers for --judge-hf-checkpoint (default 1)")
    judge_template: str = option("score_0_10", metavar="NAME|PATH", help=(
        "the judge's prompt: a built-in (" + ", ".join(JUDGE_BUILTINS) + ") or the dotted path of "
        "`template(sample) -> str` (the user message)"))
    judge_parser: str | None = option(None, metavar="NAME|PATH", help=(
        "reads the judge's answer: a built-in (" + ", ".join(JUDGE_BUILTINS) + "; default: --judge-template's "
        "name) or the dotted path of `parse(text) -> float | None` (None: nothing parseable)"))
    judge_max_new_tokens: int = option(256, positive=True, help="tokens the judge may answer with")
    judge_temperature: float = option(0.0, help="the judge's sampling temperature (> 0 lets a retry answer differently)")
    judge_retries: int = option(2, at_least=0, help=(
        "tries after the first when the judge cannot be reached, answers 5xx or answers nothing parseable"))
    judge_timeout: float = option(120.0, positive=True, help=(
        "seconds for judging one sample, every try included; past it the sample fails (never a reward)"))
    reward_routes: str | None = option(None, metavar="YAML", help=(
        "route each sample to a rewarder by a field of its data row (rollout/reward_routing.py; docs/rewards.md): "
        "field, routes {value: {reward, concurrency}}, default"))
    judge_api_key_env: str | None = option(None, metavar="NAME", help=(
        "the environment variable that holds --judge-url's API key, sent as `Authorization: Bearer` to the judge "
        "alone (the key itself never on the command line)"))
    # derived (config.parse_config: with_engines): the servers this run starts for them; once their
    # groups run (Runtime), the groups' configs, which carry the reported URLs
    rm_engines: EngineConfig | None = field(default=None, kw_only=True)
    judge_engines: EngineConfig | None = field(default=None, kw_only=True)

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        v = dict(values)
        if v["rm_hf_checkpoint"] is not None:
            v["rm_num_engines"] = v["rm_num_engines"] or 1
        if v["judge_hf_checkpoint"] is not None and v["judge_url"] is None:
            v["judge_num_engines"] = v["judge_num_engines"] or 1
        return v

    def __post_init__(self) -> None:
        if self.rm_num_engines is not None and self.rm_hf_checkpoint is None:
            raise ConfigError("--rm-num-engines sizes the reward model this run serves: add --rm-hf-checkpoint DIR")
        if self.rm_hf_checkpoint is not None:
            check_reward_model_dir(self.rm_hf_checkpoint)
        if self.judge_hf_checkpoint is not None and self.judge_url is not None:
            raise ConfigError("give either --judge-hf-checkpoint (this run serves the judge) or --judge-url, not both")
        if self.judge_num_engines is not None and self.judge_hf_checkpoint is None:
            raise ConfigError("--judge-num-engines sizes the judge this run serves: add --judge-hf-checkpoint DIR")
        if self.judge_hf_checkpoint is not None and not (Path(self.judge_hf_checkpoint) / "config.json").is_file():
            raise ConfigError(f"--judge-hf-checkpoint {self.judge_hf_checkpoint}: not an HF checkpoint directory "
                              "(no config.json)")
        if self.judge_url is not None and not self.judge_url.startswith(("http://", "https://")):
            raise ConfigError(f"--judge-url {self.judge_url!r}: give http://HOST:PORT")
        if self.judge_parser is None and self.judge_template not in JUDGE_BUILTINS:
            raise ConfigError(f"--judge-template {self.judge_template}: a template of yours needs --judge-parser "
                              f"(a built-in: {', '.join(JUDGE_BUILTINS)}, or the dotted path of parse(text))")
        if self.judge_api_key_env is not None:
            if self.judge_url is None:
                raise ConfigError("--judge-api-key-env names the key of a remote judge: add --judge-url URL (a judge "
                                  "this run serves uses the run's own key)")
            api_key_from_env(self.judge_api_key_env, "--judge-api-key-env")
        if self.judge_temperature < 0:
            raise ConfigError(f"--judge-temperature must be >= 0, got {self.judge_temperature}")

    @property
    def has_judge(self) -> bool:
        return self.judge_hf_checkpoint is not None or self.judge_url is not None

    @property
    def parser_name(self) -> str:
        """--judge-parser, else --judge-template's built-in name (checked above)."""
        return self.judge_parser or self.judge_template

    @property
    def engine_count(self) -> int:
        """Servers this run starts for the reward model and the judge."""
        return (self.rm_num_engines or 0) + (self.judge_num_engines or 0 if self.judge_url is None else 0)

    def with_engines(self, policy: EngineConfig, taken: set[int], other_cpu_engines: int) -> RewardServingConfig:
        """This config with the EngineConfigs of the servers it starts: the policy's settings, ports of
        their own (none in `taken`: the policy's and the teacher's), the reward model's as embedding
        servers (SGLang's --is-embedding: /classify answers the score head's outputs)."""
        rm = judge = None
        if self.rm_hf_checkpoint is not None:
            assert self.rm_num_engines is not None  # derive_fields
            rm = served_engine_config(policy, self.rm_hf_checkpoint, self.rm_num_engines, taken,
                                      other_cpu_engines + self.engine_count - self.rm_num_engines, ("--is-embedding",))
            taken = taken | {*rm.engine_ports, rm.resolved_router_port or 0}
        if self.judge_hf_checkpoint is not None:
            assert self.judge_num_engines is not None
            judge = served_engine_config(policy, self.judge_hf_checkpoint, self.judge_num_engines, taken,
                                         other_cpu_engines + self.engine_count - self.judge_num_engines, ())
        return dataclasses.replace(self, rm_engines=rm, judge_engines=judge)


def check_reward_model_dir(path: str) -> None:
    """ConfigError in one line naming the file unless `path` holds an HF checkpoint of a class the
    reward engines serve."""
    config_file = Path(path) / "config.json"
    try:
        architectures = json.loads(config_file.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(f"--rm-hf-checkpoint {path}: cannot read {config_file} ({type(err).__name__})") from None
    if not any(name in REWARD_MODEL_CLASSES for name in architectures):
        raise ConfigError(f"--rm-hf-checkpoint {path}: {config_file} names architectures {architectures}, not a reward "
                          f"model class SGLang serves: one of {', '.join(REWARD_MODEL_CLASSES)}")


def served_engine_config(policy: EngineConfig, model_path: str, num_engines: int, taken: set[int],
                         other_cpu_engines: int, extra_server_flags: tuple[str, ...]) -> EngineConfig:
    """The policy's engine settings (device, --sglang-* passthrough, API key, timeouts) for
    `num_engines` servers of another model on ports none of `taken` (no adapter, never released)."""
    taken = taken | {*policy.engine_ports, policy.resolved_router_port or 0}
    for _ in range(20):  # none of the groups' ports are bound yet: a free port may have gone to two
        served = resolve_ports(rebuild(
            policy, model_path=str(model_path), num_engines=num_engines, num_gpus=None, base_port=None,
            router_port=None, engine_ports=(), resolved_router_port=None, engine_nodes=(), live=LiveEndpoints(),
            other_cpu_engines=other_cpu_engines, adapter=None, return_routed_experts=False, colocated=False,
            server_passthrough=(*policy.server_passthrough, *extra_server_flags)))
        if not taken & {*served.engine_ports, served.resolved_router_port}:
            return served
    raise RuntimeError(f"no free ports for the engines of {model_path} apart from the run's other engines")
