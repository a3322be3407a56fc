"""The one typed configuration of a run, built once from the command line.

    cfg = parse_config(sys.argv[1:])
    cfg.engines.router_url, cfg.rollout.n_samples_per_prompt, cfg.train.optimizer.lr, cfg.batch_plan, ...

Each part declares its flags once, as `option(...)` fields of its own dataclass (lean_rl/options.py):
run: run_config.py; engines: backends/sglang/config.py; prompt data: buffer/config.py; rollout,
reward: rollout/config.py; eval: rollout/eval_config.py; model + parallelism: backends/megatron/config.py; optimizer,
batches, checkpoints, placement: backends/megatron/train_config.py; algorithm: algorithms/config.py;
weight sync: weight_sync/config.py; on-policy distillation: rollout/distillation.py. This module
assembles them, derives once what several parts need (the trainer layout: device, world and
data-parallel size; the batch plan; ports; eval sampling) and checks what only the whole can check
(flags that contradict each other: config_checks.py).
`--sglang-<flag>` and `--router-<flag>` pass through to the servers; any other unknown flag is an
error naming it. The model architecture comes from the --hf-checkpoint's config.json; Megatron model
flags, when given (e.g. from scripts/models/*.sh), must agree with it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lean_rl.algorithms.config import AlgorithmConfig
from lean_rl.algorithms.names import ENGINELESS_LOSS_TYPES, PAIRWISE_LOSS_TYPES
from lean_rl.backends.megatron.config import MegatronConfig, ModelFlags, ParallelConfig, PrecisionFlags
from lean_rl.backends.megatron.hf_config import checkpoint_dtype
from lean_rl.backends.megatron.train_config import CheckpointConfig, TrainConfig, training_temperature
from lean_rl.backends.megatron.trainer_layout import TrainerLayout
from lean_rl.backends.megatron.batch_plan import BatchPlan
from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.server_command import gpu_fp32_note
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.backends.sglang.api_keys import API_KEY_ENV
from lean_rl.backends.sglang.command_line import engines_dtype, split_passthrough
from lean_rl.buffer.config import DataConfig
from lean_rl.buffer.prompt_source import check_prompt_file_type
from lean_rl import config_checks
from lean_rl.cli import DEBUG_HELP, ArgumentParser
from lean_rl.config_checks import DEFAULT_ROLLOUT
from lean_rl.options import ConfigError, add_options, read_options, rebuild
from lean_rl.overlong_shaping import check_overlong_flags
from lean_rl.rollout.config import VERIFIERS_PROMPTS, RewardConfig, RolloutConfig
from lean_rl.rollout.eval_config import EvalConfig
from lean_rl.rollout.distillation_config import DistillationConfig
from lean_rl.rollout.preference_config import check_one_step_per_rollout, preference_data
from lean_rl.rollout.reward_serving_config import RewardServingConfig
from lean_rl.run_config import RunConfig
from lean_rl.slime_flags import slime_hint
from lean_rl.utils.custom_config import ReadOnlyMapping, load_custom_config, load_yaml_mapping
from lean_rl.utils.device import detect_device
from lean_rl.weight_sync.config import WeightSyncConfig, resolve_lora_sync

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Config:
    run: RunConfig
    engines: EngineConfig
    data: DataConfig
    rollout: RolloutConfig
    reward: RewardConfig
    eval: EvalConfig
    megatron: MegatronConfig
    train: TrainConfig
    algorithm: AlgorithmConfig
    weight_sync: WeightSyncConfig
    # Derived once, here, from the flags above: where the trainer runs (device, ranks, DP size) and how
    # a rollout becomes optimizer steps and micro-batches.
    layout: TrainerLayout
    batch_plan: BatchPlan
    # --custom-config-path, read once: extra settings for the user's functions (read-only; cfg.custom["key"])
    custom: Mapping[str, Any] = field(default_factory=ReadOnlyMapping)
    # --use-opd: the teacher and its engines (rollout/distillation.py)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    # --rm-hf-checkpoint, --judge-*, --reward-routes: rewarders served or called beside the rules
    # (rollout/reward_model.py, judge.py, reward_routing.py)
    reward_serving: RewardServingConfig = field(default_factory=RewardServingConfig)

    @property
    def starts_engines(self) -> bool:
        """Whether the run serves the policy on SGLang engines: not when it trains on saved rollouts
        (--debug-train-only) or on given conversations or pairs (--loss-type sft_loss / dpo_loss / rm_loss)."""
        return not (self.run.debug_train_only or self.algorithm.loss_type in ENGINELESS_LOSS_TYPES)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an abbreviation would swallow a passthrough flag (--sglang-... / --router-...)
    parser = ArgumentParser(prog="lean_rl", allow_abbrev=False, epilog=DEBUG_HELP)
    add_options(parser, RunConfig, "run")
    add_options(parser, EngineConfig, "rollout engines (SGLang + sglang-router)")  # --hf-checkpoint: here only
    add_options(parser, DataConfig, "prompt data")
    add_options(parser, RolloutConfig, "rollout")
    add_options(parser, RewardConfig, "reward")
    add_options(parser, EvalConfig, "evaluation")
    add_options(parser, ModelFlags, "megatron model")
    add_options(parser, ParallelConfig, "megatron parallelism")
    add_options(parser, PrecisionFlags, "megatron mixed precision")
    add_options(parser, TrainConfig, "optimizer")  # with "train batches", "checkpoints", "trainer placement"
    add_options(parser, AlgorithmConfig, "rl algorithm")
    add_options(parser, WeightSyncConfig, "weight sync (trainer -> SGLang engines)")
    add_options(parser, DistillationConfig, "on-policy distillation (a teacher scores the student's samples)")
    add_options(parser, RewardServingConfig, "reward models, judges and reward routing")
    return parser


def _megatron_config(argv: list[str], args: argparse.Namespace, parallel: ParallelConfig,
                     device: str) -> MegatronConfig:
    """Architecture from the HF config; Megatron model flags the user typed must agree with it. The
    trainer's dtype: --bf16 / --fp16, else float32 on CPU and 16-bit on GPU (PrecisionFlags)."""
    from lean_rl.backends.megatron.arch_flags import check_given_flags, given_model_flags_parser
    from lean_rl.backends.megatron.hf_config import arch_from_hf_config
    from lean_rl.backends.megatron.vlm_family import vlm_config_or_none

    if not args.hf_checkpoint:
        raise ConfigError("--hf-checkpoint is required (the model the engines serve and the trainer starts from)")
    if not (Path(args.hf_checkpoint) / "config.json").is_file():  # checked before anything reads it
        what = "no config.json there" if Path(args.hf_checkpoint).is_dir() else "not a directory"
        raise ConfigError(f"--hf-checkpoint {args.hf_checkpoint}: {what} (an HF checkpoint: config.json, tokenizer, "
                          "*.safetensors)")
    model = read_options(ModelFlags, args)
    hf_arch = arch_from_hf_config(args.hf_checkpoint, model.make_vocab_size_divisible_by, model.seq_length)
    given, _ = given_model_flags_parser().parse_known_args(argv)
    given = {k: v for k, v in vars(given).items() if k not in ParallelConfig.__dataclass_fields__}
    arch = check_given_flags(given, hf_arch, args.hf_checkpoint) if given else hf_arch
    params_dtype = read_options(PrecisionFlags, args).params_dtype(device, checkpoint_dtype(args.hf_checkpoint))
    return MegatronConfig(arch=arch, parallel=parallel, use_rollout_routing_replay=model.use_rollout_routing_replay,
                          params_dtype=params_dtype, transformer_impl=model.transformer_impl,
                          vlm_hf_config=vlm_config_or_none(args.hf_checkpoint),
                          freeze_vision_tower=model.freeze_vision_tower)


def parse_config(argv: list[str], serving: bool = False) -> Config:
    """serving: a server whose clients send the data (lean_rl.serve_tinker): no --prompt-data."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    passthrough = split_passthrough(unknown)
    if passthrough.rest:
        raise ConfigError(f"unrecognized arguments: {' '.join(passthrough.rest)}{slime_hint(passthrough.rest)}")
    run = read_options(RunConfig, args)
    data = read_options(DataConfig, args)
    if args.verifiers_env and not data.prompt_data and not data.data_source_path:
        data = rebuild(data, data_source_path=VERIFIERS_PROMPTS)  # the environment's own dataset
    no_engines = run.debug_train_only or args.loss_type in ENGINELESS_LOSS_TYPES  # Config.starts_engines, before it exists
    rollout = config_checks.sft_rollout(args, data, read_options(RolloutConfig, args))
    reward = read_options(RewardConfig, args)
    check_overlong_flags(reward, rollout.sampling.max_response_len)
    evaluation = read_options(EvalConfig, args).with_rollout_sampling(rollout.sampling)
    evaluation = evaluation.with_sets(load_yaml_mapping(evaluation.config_path, "--eval-config"))
    config_checks.check_run_against_rollout(run, rollout)
    for flag, path in [("--prompt-data", data.prompt_data)] + [
            (f"--eval-prompt-data {name}", p) for name, p in evaluation.datasets]:
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{flag}: file {path!r} does not exist")
        if path is not None:
            try:
                check_prompt_file_type(path)
            except ValueError as err:
                raise ConfigError(f"{flag}: {err}") from None
    if not data.prompt_data and not data.data_source_path and not run.debug_train_only and not serving:
        raise ConfigError("--prompt-data is required (or --data-source-path)")
    if args.loss_type in PAIRWISE_LOSS_TYPES:  # every pair checked now; no --label-key
        data = preference_data(args.loss_type, data)
    # --prompt-data with --data-source-path: the file is the source's to read (slime's sources read
    # args.prompt_data); the buffer takes its prompts from the source
    custom = load_custom_config(rollout.custom_config.custom_config_path)
    device = detect_device()
    megatron = _megatron_config(argv, args, read_options(ParallelConfig, args), device)
    checkpoint = read_options(CheckpointConfig, args, hf_checkpoint=args.hf_checkpoint)
    train = read_options(TrainConfig, args, checkpoint=checkpoint, seed=data.seed,
                         temperature=training_temperature(rollout.sampling.temperature))
    train.lora.check_parallel(megatron.parallel)
    train.lora.check_layer_spec(megatron.transformer_impl, device)
    layout = train.placement.layout(megatron.parallel, device, on_cluster=run.ray_address is not None)
    # the ports and the services' API key (--sglang-api-key, else $LEAN_RL_API_KEY, else random), chosen once
    distillation = read_options(DistillationConfig, args)
    reward_serving = read_options(RewardServingConfig, args)
    config_checks.check_reward_choice(reward, reward_serving)
    engines = resolve_api_key(resolve_ports(read_options(
        EngineConfig, args, device=layout.device, server_passthrough=passthrough.server,
        router_passthrough=passthrough.router, on_cluster=bool(run.ray_address),
        other_cpu_engines=distillation.teacher_engine_count + reward_serving.engine_count,
        colocated=run.colocate and not (run.debug_rollout_only or no_engines),
        dtype=engines_dtype(passthrough.server, megatron.params_dtype, checkpoint_dtype(args.hf_checkpoint)))))
    fp32_note = gpu_fp32_note(engines)
    if fp32_note:
        logger.info("%s", fp32_note)
    typed_key = any(a == "--sglang-api-key" or a.startswith("--sglang-api-key=") for a in argv)
    if typed_key and engines.api_key:  # a key on the command line ('none' stores "": nothing to hide)
        logger.warning("--sglang-api-key: a key typed on the command line shows in `ps` and in Ray's job table; "
                       "prefer --sglang-api-key-file FILE or $%s", API_KEY_ENV)
    distillation = distillation.with_teacher_engines(engines)  # the teacher's tokenizer must be the student's
    teacher = distillation.teacher_engines
    reward_serving = reward_serving.with_engines(  # on ports of their own, none of the policy's or teacher's
        engines, set() if teacher is None else {*teacher.engine_ports, teacher.resolved_router_port or 0},
        distillation.teacher_engine_count)
    if distillation.top_k_if_used > megatron.arch.vocab_size:
        raise ConfigError(f"--opd-top-k {distillation.top_k_if_used} is more than the vocabulary's "
                          f"{megatron.arch.vocab_size} tokens (--hf-checkpoint's config.json)")
    if megatron.use_rollout_routing_replay:  # the policy's engines only (not the teacher's, derived above)
        engines = rebuild(engines, return_routed_experts=True)
    # the adapter is loaded by the first sync: a run without a trainer or engines has none to serve
    syncs = not (run.debug_rollout_only or no_engines)
    adapter = resolve_lora_sync(args.lora_sync, train.lora, megatron.arch.is_moe, run.async_mode,
                                config_checks.lora_unserved_family(args.hf_checkpoint, train.lora)) if syncs else None
    if adapter is not None:  # the policy's engines only: a teacher serves its own weights
        engines = rebuild(engines, adapter=adapter)
    ipc_unserved = None
    if run.colocate and not (run.debug_rollout_only or no_engines):
        engine_nodes = layout.colocated_engine_nodes(engines.num_engines, engines.gpus_per_engine)  # fails now if they do not fit
        ipc_unserved = config_checks.ipc_unserved(layout, megatron.parallel, engines, engine_nodes)
    batch_plan = BatchPlan(train.batch, layout.data_parallel_size,
                           samples_per_rollout=rollout.rollout_batch_size * rollout.n_samples_per_prompt)
    if args.loss_type in PAIRWISE_LOSS_TYPES:
        check_one_step_per_rollout(args.loss_type, batch_plan.steps_for(rollout.rollout_batch_size * 2))
        if args.loss_type == "rm_loss" and train.lora.enabled:
            raise ConfigError("--loss-type rm_loss trains a new value head, which LoRA (--lora-rank) would leave frozen")
    weight_sync = read_options(WeightSyncConfig, args, colocate=run.colocate, device=layout.device,
                               on_cluster=layout.on_cluster, ipc_unserved=ipc_unserved, adapter=adapter)
    if run.async_mode == "full" and rollout.rollout_function_path != DEFAULT_ROLLOUT:
        raise ConfigError("--async-mode full generates with the built-in continuous generator; "
                          "--rollout-function-path is not used there (use --custom-generate-function-path)")
    return Config(
        run=run,
        engines=engines,
        data=data,
        rollout=rollout,
        reward=reward,
        eval=evaluation,
        megatron=megatron,
        train=train,
        algorithm=read_options(AlgorithmConfig, args, max_response_len=rollout.sampling.max_response_len,
                               custom=custom, slime_argv=rollout.custom_config.slime_argv),
        weight_sync=weight_sync,
        layout=layout,
        batch_plan=batch_plan,
        custom=custom,
        distillation=distillation,
        reward_serving=reward_serving,
    )
