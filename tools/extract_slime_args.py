"""Write lean_rl/slime_args_table.py: every attribute slime's own parser defines, with its flag, how
argparse reads it and slime's default, taken from slime's parser itself, offline:

    python tools/extract_slime_args.py /work/.mirror/THUDM+slime/repo 624b824 \
        /work/.mirror/NVIDIA+Megatron-LM/repo > lean_rl/slime_args_table.py

slime's parser is Megatron-LM's (at the commit slime's docker/Dockerfile pins), slime's own argument
set and the installed SGLang's / sglang-router's (prefixed --sglang- / --router-, as slime adds them).
This tool extracts both repositories at those commits into a temporary directory, builds that parser
from their source and lists its actions; lean_rl never imports slime (lean_rl/slime_namespace.py
rebuilds the parser from the table). Run it once per slime commit we follow; the table is data.
Types other than int / float / str are named (lean_rl reads them as strings, or as slime's converter
does where slime_namespace.CONVERTERS names one); a default argparse could not print as a literal
(an enum member, a function) is written as its name."""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import types
import warnings
from typing import Any

# argparse action classes -> the kind slime_namespace.py rebuilds (custom actions by their base class)
KINDS = [(argparse.BooleanOptionalAction, "boolean_optional"), (argparse._StoreTrueAction, "store_true"),
         (argparse._StoreFalseAction, "store_false"), (argparse._StoreConstAction, "store_const"),
         (argparse._AppendAction, "append"), (argparse._CountAction, "count"), (argparse._StoreAction, "store")]


def extract(repo: str, commit: str, paths: list[str], into: pathlib.Path) -> None:
    archive = subprocess.run(["git", "--git-dir", repo, "archive", commit, *paths], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        tarfile.open(fileobj=f).extractall(into)


def kind_of(action: argparse.Action) -> str:
    for cls, kind in KINDS:
        if isinstance(action, cls):
            return kind
    if action.nargs == 0:  # a custom switch (SGLang's deprecated spellings)
        return "store_const" if action.const not in (None, True) else "store_true"
    return "store"


def literal(value: Any) -> Any:
    """The default as the table stores it: a literal, else its name."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple):
        return [literal(v) for v in value]
    if isinstance(value, (list, dict, str, int, float, bool, type(None))):
        try:
            json.dumps(value)
            return value
        except TypeError:
            pass
    return getattr(value, "__name__", repr(value))


def type_name(action: argparse.Action) -> str | None:
    t = action.type
    if t is None:
        return None
    return t.__name__ if t in (int, float, str) else getattr(t, "__name__", type(t).__name__)


def rows(parser: argparse.ArgumentParser, group: str) -> list[tuple]:
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        nargs = action.nargs if action.nargs not in (None, 0) else None
        out.append((group, tuple(action.option_strings), action.dest, kind_of(action), type_name(action),
                    nargs if not isinstance(nargs, int) else nargs, literal(action.default),
                    literal(action.const), list(action.choices) if action.choices and len(action.choices) < 40
                    and all(type(c) in (str, int) for c in action.choices) else None))
    return out


def build(slime_dir: pathlib.Path, megatron_dir: pathlib.Path) -> list[tuple]:
    sys.path[:0] = [str(megatron_dir), str(slime_dir)]
    for missing in ("wandb",):  # imported by slime's logging only
        try:
            __import__(missing)
        except ImportError:
            sys.modules[missing] = types.ModuleType(missing)
    warnings.filterwarnings("ignore")
    from megatron.training.arguments import add_megatron_arguments
    from slime.backends.sglang_utils.arguments import add_sglang_arguments
    from slime.utils.arguments import _pre_parse_mode, get_slime_extra_args_provider

    main = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(main)
    get_slime_extra_args_provider()(main)
    sglang = argparse.ArgumentParser(add_help=False)
    add_sglang_arguments(sglang)
    pre = argparse.ArgumentParser(add_help=False)
    sys.argv = ["train.py"]
    pre_args = _pre_parse_mode()  # slime's pre-parser: its four flags, registered nowhere else
    for dest, value in vars(pre_args).items():
        flag = "--" + dest.replace("_", "-")
        if dest == "train_backend":
            pre.add_argument(flag, type=str, default=value)
        else:
            pre.add_argument(flag, action="store_true" if value is False else "store", default=value)
    return rows(pre, "pre") + rows(main, "main") + rows(sglang, "sglang")


def build_paths(slime_repo: str, commit: str, megatron_repo: str, tmp: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """slime at `commit` and the Megatron-LM its docker/Dockerfile pins, extracted under `tmp`."""
    dockerfile = subprocess.run(["git", "--git-dir", slime_repo, "show", f"{commit}:docker/Dockerfile"], check=True,
                                capture_output=True, text=True).stdout
    megatron_commit = re.search(r"MEGATRON_COMMIT=([0-9a-f]{40})", dockerfile).group(1)  # type: ignore[union-attr]
    slime_dir, megatron_dir = tmp / "slime", tmp / f"megatron-{megatron_commit}"
    extract(slime_repo, commit, ["slime", "scripts", "examples"], slime_dir)
    extract(megatron_repo, megatron_commit, ["megatron"], megatron_dir)
    return slime_dir, megatron_dir


def main(slime_repo: str, commit: str, megatron_repo: str) -> None:
    full = subprocess.run(["git", "--git-dir", slime_repo, "rev-parse", commit], check=True, capture_output=True,
                          text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        slime_dir, megatron_dir = build_paths(slime_repo, full, megatron_repo, pathlib.Path(tmp))
        megatron_commit = megatron_dir.name.split("-", 1)[1]
        with contextlib.redirect_stdout(sys.stderr):  # what their imports print is not the table
            table = build(slime_dir, megatron_dir)
    import sglang
    import sglang_router

    versions = f"SGLang {sglang.__version__}, sglang-router {sglang_router.__version__}"
    print(f'"""slime\'s parser, attribute by attribute: generated by tools/extract_slime_args.py from THUDM/slime\n'
          f"{full}, Megatron-LM {megatron_commit} (slime's docker/Dockerfile) and {versions}.\n"
          "Do not edit: regenerate. Each row: (parser, option strings, dest, kind, type, nargs, default, const,\n"
          "choices); parser is slime's pre-parser, the Megatron + slime parser or the SGLang + router one\n"
          '(lean_rl/slime_namespace.py reads them in slime\'s order)."""\n')
    print(f'SLIME_COMMIT = "{full}"')
    print(f'MEGATRON_COMMIT = "{megatron_commit}"')
    print(f'ENGINE_VERSIONS = "{versions}"\n')
    print("# fmt: off")
    print("ROWS: tuple[tuple, ...] = (")
    for row in table:
        print(f"    {row!r},")
    print(")")


if __name__ == "__main__":
    main(*sys.argv[1:4])
