"""slime's `args`, as slime's own parser builds it from a slime command line, without slime:

    args = slime_namespace(["--hf-checkpoint", "/m", "--rollout-max-context-len", "1024", ...])
    args.rollout_max_context_len, args.context_parallel_size, args.sglang_router_request_timeout_secs ...

Every attribute slime's parser defines (Megatron-LM's, slime's and SGLang's / sglang-router's, with
slime's defaults) comes from the generated table lean_rl/slime_args_table.py (tools/extract_slime_args.py).
The namespace is filled as slime fills it (slime/utils/arguments.py parse_args): the Megatron + slime
parser, then slime's pre-parsed flags, then the SGLang + router parser, each reading the whole command
line and ignoring what it does not know; then the fields slime derives (`derive`, below, after
slime_validate_args, _set_default_megatron_args and the SGLang validate_args of slime 624b824).
Not derived: Megatron's own validate_args (data_parallel_size ...), slime's eval_datasets objects, and
whatever reads the model's files (the HF config check). A flag's value that slime would refuse
(validate_args asserts) is left to lean_rl's own checks. Imports nothing of lean_rl's but its options."""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import json
import os
from collections.abc import Sequence
from typing import Any, NoReturn

import yaml

from lean_rl.options import ConfigError
from lean_rl.slime_args_table import ROWS



def _human_int(value: str) -> int:
    """SGLang's human_readable_int: 32k, 1.5M, 2G (decimal), or an int."""
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(value[-1:].lower())
    return int(float(value[:-1]) * scale) if scale else int(value)


def _layer_pattern(value: str) -> Any:
    """Megatron's moe_freq_type / la_freq_type / no_rope_freq_type: an int, or a list pattern such as
    "([1]*3+[0]*1)*3" (int lists joined by + and repeated by *), evaluated without eval()."""
    if "[" not in value:
        return int(value)

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = ev(node.left), ev(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ConfigError(f"slime's parser: layer pattern {value!r}: only int lists, + and *")
    return ev(ast.parse(value, mode="eval").body)


def _int_tuple(value: str) -> tuple[int, ...]:
    """Megatron's tuple_type: "1,2,3" or "(1,2,3)"."""
    return tuple(int(i) for i in value.strip("()").split(","))


# the table's type names -> how slime's parser converts a value (any other type: the text as given)
CONVERTERS = {"int": int, "float": float, "str": str, "bool": bool, "loads": json.loads, "json_list_type": json.loads,
              "human_readable_int": _human_int, "moe_freq_type": _layer_pattern, "la_freq_type": _layer_pattern,
              "no_rope_freq_type": _layer_pattern, "tuple_type": _int_tuple}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"slime's parser: {message}")


@functools.lru_cache(maxsize=None)
def _parser(group: str) -> _Parser:
    parser = _Parser(add_help=False, allow_abbrev=False)
    for where, flags, dest, kind, type_name, nargs, default, const, choices in ROWS:
        if where != group:
            continue
        kwargs: dict[str, Any] = {"dest": dest, "default": default}
        if kind in ("store", "append"):
            kwargs.update(action=kind, nargs=nargs, choices=choices, type=CONVERTERS.get(type_name or "", None))
        elif kind == "store_const":
            kwargs.update(action="store_const", const=const)
        elif kind == "boolean_optional":
            kwargs.update(action=argparse.BooleanOptionalAction)
            flags = tuple(f for f in flags if not f.startswith("--no-"))
        else:
            kwargs["action"] = kind
        parser.add_argument(*flags, **{k: v for k, v in kwargs.items() if v is not None or k == "default"})
    return parser


def defined_flags() -> set[str]:
    """Every option string slime's parser knows."""
    return {flag for row in ROWS for flag in row[1]}


def defined_attributes() -> set[str]:
    """Every attribute slime's parser defines (before derivation)."""
    return {row[2] for row in ROWS}


def slime_namespace(argv: Sequence[str]) -> argparse.Namespace:
    """slime's `args` for this command line (the flags given to slime's train.py)."""
    argv = list(argv)
    pre, _ = _parser("pre").parse_known_args(argv)
    args, _ = _parser("main").parse_known_args(argv)
    vars(args).update(vars(pre))
    if not (pre.debug_train_only or pre.load_debug_rollout_data is not None):  # slime skips SGLang's then
        engine, _ = _parser("sglang").parse_known_args(argv)
        vars(args).update(vars(engine))
        args.sglang_tensor_parallel_size = _engine_tp_size(argv)
    return derive(args)


def _engine_tp_size(argv: list[str]) -> int:
    """slime's sglang_parse_args default: the engine's GPUs over its pipeline stages."""
    parser = _Parser(add_help=False)
    for flag in ("--rollout-num-gpus-per-engine", "--sglang-pp-size", "--sglang-pipeline-parallel-size"):
        parser.add_argument(flag, type=int, default=1)
    given, _ = parser.parse_known_args(argv)
    pp = given.sglang_pp_size if given.sglang_pp_size != 1 else given.sglang_pipeline_parallel_size
    return given.rollout_num_gpus_per_engine // pp


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


@functools.lru_cache(maxsize=8)
def _parsed(argv_json: str) -> argparse.Namespace:
    return slime_namespace(json.loads(argv_json))


def slime_view(slime_argv: str | None, lean: argparse.Namespace) -> argparse.Namespace:
    """The `args` a slime function receives (a new namespace each call). Launched by
    lean_rl.slime_launch (`slime_argv`: its slime command line, a JSON list): slime's namespace for it,
    with lean_rl's own attributes (`lean`) where slime has no such name. Otherwise lean_rl's values
    over slime's defaults (the run's flags are lean_rl's)."""
    slime = copy.deepcopy(_parsed(slime_argv if slime_argv is not None else "[]"))
    if slime_argv is None:
        vars(slime).update(vars(lean))
        return slime
    for name, value in vars(lean).items():
        if not hasattr(slime, name):
            setattr(slime, name, value)
    return slime
