"""On-policy distillation's flags (--use-opd ...) and the teacher's engine settings: the config layer of
lean_rl/rollout/distillation.py, importable without the rollout code (lean_rl.config loads only
configs)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.live_endpoints import LiveEndpoints
from lean_rl.backends.sglang.ports_and_key import resolve_ports
from lean_rl.buffer.prompt_source import load_tokenizer
from lean_rl.options import ConfigError, option, rebuild

OPD_TYPES = ("sglang", "megatron")  # the teacher on SGLang servers, or inside the trainer
OPD_ESTIMATORS = ("topk", "sampled")  # lean_rl/algorithms/distillation.py


@dataclass(frozen=True)
class DistillationConfig:
    use_opd: bool = option(False, help=(
        "on-policy distillation: a teacher scores every response token the student sampled, and the "
        "advantage becomes A - --opd-kl-coef * (log p_student - log p_teacher) (the reverse KL, per token; "
        "train/opd_reverse_kl). Without --rm-type / --custom-rm-path every reward is 0: pure distillation"))
    opd_type: str | None = option(None, choices=OPD_TYPES, help=(
        "where the teacher runs (required with --use-opd): sglang = SGLang servers, this run's own "
        "(--opd-teacher-hf-checkpoint) or yours (--opd-teacher-url), scoring each sample after generation; "
        "megatron = inside the trainer (--opd-teacher-load): the teacher's weights, of the student's "
        "architecture, wait in host memory and are swapped into the model for one forward pass over the "
        "rollout before training, as the reference model's are"))
    opd_kl_coef: float = option(1.0, help=(
        "weight of the teacher's reverse KL: of the top-k loss term (topk), or of the per-token penalty in the "
        "advantage (sampled)"))
    opd_estimator: str = option("topk", choices=OPD_ESTIMATORS, help=(
        "how the student is scored against the teacher at each response token t. topk (default): the reverse "
        "KL over the teacher's --opd-top-k likeliest tokens S_t plus one tail bucket, a loss term with an exact "
        "gradient: sum_{v in S_t} p_s(v) log(p_s(v)/p_t(v)) + p_s(tail) log(p_s(tail)/p_t(tail)), "
        "p(tail) = 1 - sum_{v in S_t} p(v) (train/opd_reverse_kl); it sees where the teacher puts its mass, so "
        "a peaked teacher does not collapse the student onto one mode. sampled: slime's k1 on the sampled "
        "token only, A_t <- A_t - --opd-kl-coef * (log p_s(y_t) - log p_t(y_t))"))
    opd_top_k: int = option(20, positive=True, help=(
        "--opd-estimator topk: how many of the teacher's likeliest tokens SGLang returns per response token "
        "(top_logprobs_num)"))
    teacher_hf_checkpoint: str | None = option(None, flag="--opd-teacher-hf-checkpoint", metavar="DIR", help=(
        "HF checkpoint of the teacher, served by SGLang engines this run starts (its own router, no weight "
        "updates); its tokenizer must be --hf-checkpoint's"))
    teacher_num_engines: int | None = option(None, flag="--opd-teacher-num-engines", positive=True, help=(
        "SGLang servers for the teacher (default 1; on CPU they share the cores with the student's)"))
    teacher_load: str | None = option(None, flag="--opd-teacher-load", metavar="DIR", help=(
        "--opd-type megatron: the teacher's Megatron torch_dist checkpoint (a root that --save wrote, or one "
        "iter_* directory); the student's architecture and layout, any of its steps"))
    teacher_url: str | None = option(None, flag="--opd-teacher-url", metavar="URL", help=(
        "instead of --opd-teacher-hf-checkpoint: an SGLang server or sglang-router serving the teacher, "
        "started by you (called without an API key; its tokenizer must be --hf-checkpoint's: not checked)"))
    # derived (config.parse_config: with_teacher_engines): the teacher's EngineConfig; once its group
    # runs (Runtime), the group's config, which carries the reported URLs
    teacher_engines: EngineConfig | None = field(default=None, kw_only=True)

    @staticmethod
    def derive_fields(values: dict[str, Any]) -> dict[str, Any]:
        """A teacher this run serves gets one server unless --opd-teacher-num-engines says more
        (options.build runs it before the checks, which name the flag only when the user gave it)."""
        v = dict(values)
        if v["use_opd"] and v["teacher_hf_checkpoint"] is not None and v["teacher_url"] is None:
            v["teacher_num_engines"] = v["teacher_num_engines"] or 1
        return v

    def __post_init__(self) -> None:
        given = [flag for flag, value in (("--opd-type", self.opd_type),
                                          ("--opd-teacher-hf-checkpoint", self.teacher_hf_checkpoint),
                                          ("--opd-teacher-url", self.teacher_url),
                                          ("--opd-teacher-num-engines", self.teacher_num_engines),
                                          ("--opd-teacher-load", self.teacher_load)) if value is not None]
        if not self.use_opd:
            if given:
                raise ConfigError(f"{given[0]} is a setting of on-policy distillation: add --use-opd, or drop it")
            return
        if self.opd_type is None:
            raise ConfigError("--use-opd needs --opd-type sglang (the teacher served by SGLang) or megatron "
                              "(the teacher inside the trainer)")
        if self.opd_type not in OPD_TYPES:
            raise ConfigError(f"--opd-type {self.opd_type!r}: choose one of {', '.join(OPD_TYPES)}")
        if self.opd_kl_coef <= 0:
            raise ConfigError(f"--opd-kl-coef must be > 0 (the weight of the teacher's signal), got {self.opd_kl_coef}")
        if self.opd_type == "megatron":
            served = [flag for flag in given if flag in ("--opd-teacher-hf-checkpoint", "--opd-teacher-url",
                                                         "--opd-teacher-num-engines")]
            if served:
                raise ConfigError(f"{served[0]} is a setting of --opd-type sglang; --opd-type megatron takes the "
                                  "teacher from --opd-teacher-load")
            if self.teacher_load is None:
                raise ConfigError("--opd-type megatron needs --opd-teacher-load DIR (the teacher's torch_dist checkpoint)")
            if not Path(self.teacher_load).is_dir():
                raise ConfigError(f"--opd-teacher-load {self.teacher_load}: not a directory (a Megatron checkpoint "
                                  "root, or one of its iter_* directories)")
            return
        if self.teacher_load is not None:
            raise ConfigError("--opd-teacher-load is a setting of --opd-type megatron (the teacher inside the trainer)")
        if (self.teacher_hf_checkpoint is None) == (self.teacher_url is None):
            raise ConfigError("--use-opd --opd-type sglang needs exactly one of --opd-teacher-hf-checkpoint DIR "
                              "(this run serves the teacher) and --opd-teacher-url URL (a server of yours)")
        if self.teacher_url is not None:
            if self.teacher_num_engines is not None:
                raise ConfigError("--opd-teacher-num-engines sizes the teacher this run serves "
                                  "(--opd-teacher-hf-checkpoint); --opd-teacher-url is a server of yours")
            if not self.teacher_url.startswith(("http://", "https://")):
                raise ConfigError(f"--opd-teacher-url {self.teacher_url!r}: give http://HOST:PORT")
            return
        if not (Path(self.teacher_hf_checkpoint) / "config.json").is_file():
            raise ConfigError(f"--opd-teacher-hf-checkpoint {self.teacher_hf_checkpoint}: not an HF checkpoint "
                              "directory (no config.json)")

    @property
    def top_k_if_used(self) -> int:
        """The teacher's top-k width (0: the sampled tokens' log-probs only, or no distillation)."""
        return self.opd_top_k if self.use_opd and self.opd_estimator == "topk" else 0

    @property
    def scores_in_rollout(self) -> bool:
        """The teacher scores each sample after generation (--opd-type sglang), not the trainer."""
        return self.use_opd and self.opd_type == "sglang"

    @property
    def teacher_in_trainer(self) -> str | None:
        """--opd-type megatron: the teacher's checkpoint, which the trainer loads (None otherwise)."""
        return self.teacher_load if self.use_opd and self.opd_type == "megatron" else None

    @property
    def serves_teacher(self) -> bool:
        """This run starts the teacher's engines (--opd-teacher-hf-checkpoint)."""
        return self.scores_in_rollout and self.teacher_hf_checkpoint is not None

    @property
    def teacher_engine_count(self) -> int:
        """Teacher servers this run starts (0 with --opd-teacher-url or without --use-opd)."""
        return self.teacher_num_engines if self.serves_teacher else 0

    def with_teacher_engines(self, student: EngineConfig) -> DistillationConfig:
        """This config with the teacher's EngineConfig (when the run serves the teacher), after checking
        that the teacher's tokenizer is the student's."""
        if not self.serves_teacher:
            return self
        check_same_vocabulary(student.model_path, self.teacher_hf_checkpoint)
        return dataclasses.replace(self, teacher_engines=teacher_engine_config(
            student, self.teacher_hf_checkpoint, self.teacher_num_engines))


def check_same_vocabulary(student_dir: str, teacher_dir: str) -> None:
    """ConfigError naming both directories unless their tokenizers map the same strings to the same
    ids: the teacher must score exactly the tokens the student sampled."""
    vocabularies = []
    for flag, path in (("--hf-checkpoint", student_dir), ("--opd-teacher-hf-checkpoint", teacher_dir)):
        try:
            vocabularies.append(load_tokenizer(str(path)).get_vocab())
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds for an unusable directory
            raise ConfigError(f"{flag} {path}: cannot load its tokenizer ({type(err).__name__}: {err})") from None
    student, teacher = vocabularies
    if student != teacher:
        differ = sum(student.get(token) != teacher.get(token) for token in student.keys() | teacher.keys())
        raise ConfigError(
            f"--opd-teacher-hf-checkpoint {teacher_dir}: its tokenizer differs from --hf-checkpoint {student_dir}'s "
            f"({len(teacher)} vs {len(student)} tokens, {differ} of them missing or with another id); the teacher "
            "must score the very token ids the student samples: distill from a teacher of the same tokenizer")


def teacher_engine_config(student: EngineConfig, model_path: str, num_engines: int) -> EngineConfig:
    """The student's engine settings (device, --sglang-* passthrough, API key, timeouts, threads) for
    `num_engines` servers of the teacher, on ports of their own, none of the student's."""
    taken = {*student.engine_ports, student.resolved_router_port}
    for _ in range(20):  # neither group's ports are bound yet: a free port may have gone to both
        teacher = resolve_ports(rebuild(
            student, model_path=str(model_path), num_engines=num_engines, num_gpus=None, base_port=None,
            router_port=None, engine_ports=(), resolved_router_port=None, engine_nodes=(), live=LiveEndpoints(),
            other_cpu_engines=student.num_engines,
            colocated=False))  # never released: the teacher keeps its weights and its own devices
        if not taken & {*teacher.engine_ports, teacher.resolved_router_port}:
            return teacher
    raise RuntimeError("no free ports for the teacher's engines apart from the student's")


# ---------------------------------------------------------------- scoring
