"""slime's `args`, as slime's own parser builds it from a slime command line, without slime:

    args = slime_namespace(["--hf-checkpoint", "/m", "--rollout-max-context-len", "1024", ...])
    args.rollout_max_context_len, args.context_parallel_size, args.sglang_router_request_timeout_secs ...

Every attribute slime's parser defines (Megatron-LM's, slime's and SGLang's / sglang-router's, with
slime's defaults) comes from the generated table lean_rl/slime_args_table.py (tools/extract_slime_args.py).
The namespace is filled as slime fills it (slime/utils/arguments.py parse_args): the Megatron + slime
parser, then slime's pre-parsed flags, then the SGLang + router parser, each reading the whole command
line and ignoring what it does not know; then the fields slime derives (lean_rl/slime_derive.py).
Imports nothing of lean_rl's but its options and slime_derive."""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import json
from collections.abc import Sequence
from typing import Any, NoReturn

from lean_rl.options import ConfigError
from lean_rl.slime_args_table import ROWS
from lean_rl.slime_derive import derive


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
