"""Command line of the checkpoint converters:

    python -m lean_rl.convert hf-to-megatron --hf DIR --save DIR [--tensor-model-parallel-size N]
        [--pipeline-model-parallel-size N] [--expert-model-parallel-size N] [--make-vocab-size-divisible-by N]
        [--dtype float32|bfloat16|float16] [--max-shard-size 2GB] [--iteration N] [any Megatron model flag]
    python -m lean_rl.convert hf-to-megatron --hf DIR --print-megatron-args
    python -m lean_rl.convert megatron-to-hf --load DIR --save DIR [--hf-config DIR] [--iteration N]
        [--dtype ...] [--max-shard-size 5GB]

(tools/convert_ckpt/{hf_to_megatron,megatron_to_hf}.py are the same commands.) Megatron model flags
given to hf-to-megatron are checked against the HF config: a contradiction is an error naming the flag,
the given value and the HF value. Errors exit with status 2 and one line on stderr; no output
directory is left behind."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lean_rl.backends.megatron.arch_flags import check_given_flags, given_model_flags_parser, model_args_script
from lean_rl.backends.megatron.config import ParallelConfig
from lean_rl.backends.megatron.hf_config import arch_from_hf_config
from lean_rl.convert.output_dir import OutputExistsError
from lean_rl.convert.safetensors_io import CheckpointError, parse_size
from lean_rl.cli import run_command
from lean_rl.options import ConfigError

_PARALLEL_DESTS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
                   "sequence_parallel", "moe_token_dispatcher_type")


def _hf_to_megatron_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf_to_megatron", allow_abbrev=False,
        description="HF safetensors -> Megatron torch_dist (model only). The layout flags validate the split "
                    "and set the vocab padding; the checkpoint itself reshards to any layout on load.",
        epilog="Any Megatron model flag (--num-layers, --hidden-size, ...) may also be given; it must agree "
               "with the HF config.")
    parser.add_argument("--hf", required=True, help="HF checkpoint directory (config.json + safetensors)")
    parser.add_argument("--save", help="output root (created; must not exist or be empty)")
    parser.add_argument("--print-megatron-args", action="store_true",
                        help="print the Megatron architecture flags of the HF model (bash MODEL_ARGS=(...)) and exit")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="store tensors in this dtype (default: the HF checkpoint's)")
    parser.add_argument("--max-shard-size", default=None,
                        help="cut .distcp files at this size (default: the largest input shard)")
    parser.add_argument("--iteration", type=int, default=0, help="iteration number to store it under (default 0)")
    return parser


def _megatron_to_hf_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron_to_hf", allow_abbrev=False,
                                     description="Megatron torch_dist -> HF safetensors (streaming).")
    parser.add_argument("--load", required=True,
                        help="checkpoint root (latest_checkpointed_iteration.txt) or one iter_* directory")
    parser.add_argument("--save", required=True, help="output HF directory (must not exist or be empty)")
    parser.add_argument("--hf-config", help="HF directory for config.json + tokenizer "
                                            "(default: the checkpoint's hf_config/ folder)")
    parser.add_argument("--iteration", type=int, help="iteration to convert (default: the latest)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="output dtype (default: the HF config's dtype, else the checkpoint's)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    return parser


def hf_to_megatron_main(argv: list[str]) -> int:
    from lean_rl.backends.megatron.vlm_family import is_vlm_config
    from lean_rl.convert.vlm import convert_vlm_hf_to_megatron
    from lean_rl.convert.hf_to_megatron import convert_hf_to_megatron, parse_dtype

    args, rest = _hf_to_megatron_parser().parse_known_args(argv)
    given, unknown = given_model_flags_parser().parse_known_args(rest)
    if unknown:
        raise ConfigError(f"unrecognized arguments: {' '.join(unknown)}")
    flags = vars(given)
    if args.print_megatron_args:
        check_given_flags({k: v for k, v in flags.items() if k not in _PARALLEL_DESTS}, arch_from_hf_config(args.hf),
                          args.hf)
        sys.stdout.write(model_args_script(args.hf, title=Path(args.hf).name))
        return 0
    if not args.save:
        raise ConfigError("--save is required (unless --print-megatron-args)")
    if is_vlm_config(args.hf):  # vision-language: through the model (convert/vlm.py)
        started = time.monotonic()
        out = convert_vlm_hf_to_megatron(args.hf, args.save, iteration=args.iteration,
                                         make_vocab_size_divisible_by=flags.get("make_vocab_size_divisible_by", 128))
        print(f"wrote {out} in {time.monotonic() - started:.1f}s")
        return 0
    parallel = ParallelConfig(**{k: flags[k] for k in _PARALLEL_DESTS if k in flags})
    model_flags = {k: v for k, v in flags.items() if k not in _PARALLEL_DESTS}
    started = time.monotonic()
    out = convert_hf_to_megatron(
        args.hf, args.save, parallel=parallel,
        make_vocab_size_divisible_by=flags.get("make_vocab_size_divisible_by", 128),
        dtype=parse_dtype(args.dtype) if args.dtype else None,
        max_file_bytes=parse_size(args.max_shard_size) if args.max_shard_size else None,
        iteration=args.iteration, given_flags=model_flags)
    print(f"wrote {out} in {time.monotonic() - started:.1f}s")
    return 0


def megatron_to_hf_main(argv: list[str]) -> int:
    from lean_rl.backends.megatron.checkpoint_paths import HF_CONFIG_DIR, find_checkpoint
    from lean_rl.backends.megatron.vlm_family import is_vlm_config
    from lean_rl.convert.vlm import convert_vlm_megatron_to_hf
    from lean_rl.convert.hf_to_megatron import parse_dtype
    from lean_rl.convert.megatron_to_hf import convert_megatron_to_hf

    args = _megatron_to_hf_parser().parse_args(argv)
    started = time.monotonic()
    side = find_checkpoint(args.load, args.iteration)[1] / HF_CONFIG_DIR
    config = Path(args.hf_config) if args.hf_config is not None else side  # --save-hf passes --hf-config
    if (config / "config.json").is_file() and is_vlm_config(config):
        out = convert_vlm_megatron_to_hf(args.load, args.save, iteration=args.iteration, hf_config=args.hf_config)
        print(f"wrote {out} in {time.monotonic() - started:.1f}s")
        return 0
    out = convert_megatron_to_hf(args.load, args.save, hf_config=args.hf_config, iteration=args.iteration,
                                 dtype=parse_dtype(args.dtype) if args.dtype else None,
                                 max_shard_bytes=parse_size(args.max_shard_size))
    print(f"wrote {out} in {time.monotonic() - started:.1f}s")
    return 0


COMMANDS = {"hf-to-megatron": hf_to_megatron_main, "megatron-to-hf": megatron_to_hf_main}


def run(command: str, argv: list[str]) -> int:
    """Run one command; bad input -> one line on stderr and exit status 2 (--debug: the traceback too)."""
    return run_command(command, COMMANDS[command], argv,
                       user_errors=(ConfigError, CheckpointError, OutputExistsError, FileNotFoundError, ValueError))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])
