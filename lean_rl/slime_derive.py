"""The fields slime derives after parsing, computed as slime 624b824 computes them (slime/utils/
arguments.py slime_validate_args, slime/backends/megatron_utils/arguments.py megatron_parse_args,
_set_default_megatron_args and validate_args, slime/backends/sglang_utils/arguments.py validate_args),
on the namespace lean_rl/slime_namespace.py parsed. Not derived: Megatron's own validate_args
(data_parallel_size ...), slime's eval_datasets objects, and what reads the model's files (the HF
config check). A value slime's checks would refuse (its asserts) is left to lean_rl's own checks."""

from __future__ import annotations

import argparse
import os

import yaml

from lean_rl.options import ConfigError


def _padded_vocab(args: argparse.Namespace) -> int:
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return -(-args.vocab_size // multiple) * multiple


def _megatron_defaults(args: argparse.Namespace) -> None:
    """slime's megatron_parse_args and _set_default_megatron_args."""
    args.rank = 0
    args.world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
    args.use_distributed_optimizer = True
    if not hasattr(args, "enable_gloo_process_groups"):
        args.enable_gloo_process_groups = True
    args.bf16 = not args.fp16
    args.use_persistent_ckpt_worker = args.ckpt_assume_constant_structure = args.ckpt_fully_parallel_load = True
    if args.seq_length is None:
        args.seq_length = 4096
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    args.dist_ckpt_save_pre_mcore_014 = True
    if getattr(args, "rope_type", "set") is None:
        args.rope_type = "yarn" if args.multi_latent_attention else "rope"
    if args.vocab_size and not args.padded_vocab_size:
        args.padded_vocab_size = _padded_vocab(args)
    if not args.tokenizer_model and not args.tokenizer_type:
        args.tokenizer_model, args.tokenizer_type = args.hf_checkpoint, "HuggingFaceTokenizer"
    elif not args.tokenizer_model:
        args.tokenizer_model = args.hf_checkpoint


def _eval_prompt_data(args: argparse.Namespace) -> None:
    """slime's _resolve_eval_datasets, as far as args.eval_prompt_data goes (name, path, name, path ...)."""
    if args.eval_config:
        raw = _yaml(args.eval_config, "--eval-config")
        datasets = raw.get("eval", raw).get("datasets") or []
        if isinstance(datasets, dict):
            datasets = [{"name": name, **(entry or {})} for name, entry in datasets.items()]
        pairs = [(d["name"], d.get("path")) for d in datasets]
    elif args.eval_prompt_data:
        values = list(args.eval_prompt_data)
        values = ["aime", *values] if len(values) == 1 else values
        pairs = [(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
    else:
        pairs = []
    args.eval_prompt_data = [item for pair in pairs for item in pair] or None


def _yaml(path: str, flag: str) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{flag} {path}: {err}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: a YAML mapping, got {type(data).__name__}")
    return data


def _checkpoints(args: argparse.Namespace) -> None:
    load_is_megatron = args.load is not None and os.path.exists(os.path.join(args.load, "latest_checkpointed_iteration.txt"))
    load_is_hf = args.load is not None and os.path.isfile(os.path.join(args.load, "config.json"))
    if not load_is_megatron:
        args.no_load_optim = args.no_load_rng = args.finetune = True
        if not load_is_hf:
            args.load = args.ref_load
        if args.ref_ckpt_step is not None:
            args.ckpt_step = args.ref_ckpt_step
        if args.start_rollout_id is None:
            args.start_rollout_id = 0


def _placement(args: argparse.Namespace) -> None:
    """slime's offload / colocate / debug-rollout-only rules."""
    if args.offload:
        args.offload_train = args.offload_rollout = True
    del args.offload
    if args.debug_rollout_only:
        if args.rollout_external or (args.rollout_num_gpus is None and not args.colocate):
            pass  # the second: slime stops with a TypeError; lean_rl places its engines without the count
        elif args.colocate and args.rollout_num_gpus is None:
            args.rollout_num_gpus = args.actor_num_gpus_per_node * args.actor_num_nodes
        elif args.rollout_num_gpus == 0:
            args.actor_num_gpus_per_node = args.actor_num_nodes = 0
        else:
            args.actor_num_gpus_per_node = min(8, args.rollout_num_gpus)
            args.actor_num_nodes = args.rollout_num_gpus // args.actor_num_gpus_per_node
        args.colocate = False
        args.offload_train = args.offload_rollout = False
    if args.colocate:
        if args.release_train:
            args.offload_train, args.offload_rollout = False, True
        elif args.offload_train is None:
            args.offload_train = True
        if args.offload_rollout is None:
            args.offload_rollout = True
        if args.rollout_num_gpus is None:
            args.rollout_num_gpus = args.actor_num_gpus_per_node * args.actor_num_nodes
    args.offload_train = bool(args.offload_train) or args.use_critic
    args.offload_rollout = bool(args.offload_rollout)
    if args.offload_train:
        args.disable_grad_buffers_cpu_backup = args.disable_param_buffers_cpu_backup = True


def _slime_fields(args: argparse.Namespace) -> None:
    """slime_validate_args' derived fields (its checks are lean_rl's to make)."""
    _eval_prompt_data(args)
    _checkpoints(args)
    if args.use_dynamic_batch_size and args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
    if getattr(args, "balance_by_flops", False):
        args.balance_data = True
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.eval_reward_key is None:
        args.eval_reward_key = args.reward_key
    if args.dump_details is not None:
        args.save_debug_rollout_data = f"{args.dump_details}/rollout_data/{{rollout_id}}.pt"
        args.save_debug_train_data = f"{args.dump_details}/train_data/{{rollout_id}}.pt"
    if args.load_debug_rollout_data is not None:
        args.debug_train_only = True
    args.rollout_external = args.rollout_external_engine_addrs is not None
    args.use_critic = args.advantage_estimator == "ppo"
    args.critic_num_gpus_per_node, args.critic_num_nodes = args.actor_num_gpus_per_node, args.actor_num_nodes
    _placement(args)
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.num_steps_per_rollout is not None:
        args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt // args.num_steps_per_rollout
    if args.n_samples_per_prompt == 1:
        args.grpo_std_normalization = False
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True
    if args.custom_config_path:
        for key, value in _yaml(args.custom_config_path, "--custom-config-path").items():
            setattr(args, key, value)
    if args.eval_max_context_len is None:
        args.eval_max_context_len = args.rollout_max_context_len
    if args.rollout_max_context_len is not None and args.rollout_max_prompt_len is None:
        args.rollout_max_prompt_len = args.rollout_max_context_len - 1
    if args.release_train and args.save_interval is None:
        args.save_interval = 1


def _megatron_validate(args: argparse.Namespace) -> None:
    """The fields slime's own validate_args (megatron_utils/arguments.py) sets after Megatron's."""
    args.variable_seq_lengths = True
    if getattr(args, "moe_token_dispatcher_type", None) == "allgather":
        args.moe_token_dispatcher_type = "alltoall"


def _sglang_fields(args: argparse.Namespace) -> None:
    """slime's sglang_utils validate_args: both spellings of the SGLang sizes, the engine's TP size."""
    for current, legacy in (("sglang_dp_size", "sglang_data_parallel_size"), ("sglang_pp_size",
                            "sglang_pipeline_parallel_size"), ("sglang_ep_size", "sglang_expert_parallel_size"),
                            ("sglang_moe_dp_size", "sglang_moe_data_parallel_size")):
        if hasattr(args, current) or hasattr(args, legacy):
            value = getattr(args, current) if hasattr(args, current) else getattr(args, legacy)
            setattr(args, current, value)
            setattr(args, legacy, value)
    pp = getattr(args, "sglang_pp_size", 1) or 1
    args.sglang_tp_size = args.rollout_num_gpus_per_engine // pp if pp > 1 else args.rollout_num_gpus_per_engine
    if args.sglang_router_ip and ":" in args.sglang_router_ip and not args.sglang_router_ip.startswith("["):
        args.sglang_router_ip = f"[{args.sglang_router_ip}]"


def derive(args: argparse.Namespace) -> argparse.Namespace:
    """The fields slime computes after parsing, in slime's order."""
    _megatron_defaults(args)
    _slime_fields(args)
    if args.train_backend == "megatron" and not args.debug_rollout_only:
        _megatron_validate(args)
    if not args.debug_train_only:
        _sglang_fields(args)
    return args
