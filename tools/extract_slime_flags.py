"""Write the list of slime's launch flags that lean_rl/slime_flags.py must cover (one flag a line,
with where it came from), read from a git mirror of THUDM/slime at one commit:

    python tools/extract_slime_flags.py /work/.mirror/THUDM+slime/repo HEAD > tests/unit/slime_flag_list.txt

The flags are those slime's own parser adds (slime/utils/arguments.py and the slime-owned ones of
slime/backends/sglang_utils/arguments.py; a BooleanOptionalAction also gives its --no- form), and the
Megatron flags slime's launch scripts pass to train.py / train_async.py (inside their bash arrays:
examples/*/*.sh, scripts/run-*.sh, scripts/models/*.sh, scripts/low_precision/*.sh). --sglang-<flag>
and --router-<flag> are SGLang's and sglang-router's own flags, passed through by slime and lean_rl
alike, so they are not listed one by one. Run once per slime commit we follow; the list is data."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

SLIME_ARGUMENT_FILES = ("slime/utils/arguments.py", "slime/backends/sglang_utils/arguments.py")
SCRIPT_PATTERN = re.compile(r"^(examples/[^/]+/[^/]+\.sh|scripts/run-[^/]+\.sh|scripts/models/[^/]+\.sh|"
                            r"scripts/low_precision/[^/]+\.sh)$")
ARRAY = re.compile(r"^\s*[A-Z_][A-Z0-9_]*=\((.*?)^\s*\)", re.S | re.M)
TRAIN_CALL = re.compile(r"train(?:_async)?\.py(.*?)(?:\n\s*\n|\Z)", re.S)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
PASSED_THROUGH = ("--sglang-", "--router-")


def git_show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def parser_flags(source: str) -> list[str]:
    """Every long option string given to add_argument / reset_arg, in source order."""
    flags = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in ("add_argument", "reset_arg", "old_add_argument"):
            continue
        optional = any(k.arg == "action" and isinstance(k.value, ast.Attribute) and k.value.attr ==
                       "BooleanOptionalAction" for k in node.keywords)
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                flags.append(arg.value)
                if optional:
                    flags.append("--no-" + arg.value[2:])
    return flags


def script_flags(text: str) -> set[str]:
    found: set[str] = set()
    for block in ARRAY.finditer(text):
        found.update(FLAG.findall(block.group(1)))
    for call in TRAIN_CALL.finditer(text):
        found.update(FLAG.findall(call.group(1)))
    return found


def main(repo: str, commit: str) -> None:
    full = subprocess.run(["git", "-C", repo, "rev-parse", commit], check=True, capture_output=True,
                          text=True).stdout.strip()
    own: dict[str, str] = {}
    for path in SLIME_ARGUMENT_FILES:
        for flag in parser_flags(git_show(repo, full, path)):
            if not flag.startswith(PASSED_THROUGH) or flag.startswith("--sglang-router-") or flag in (
                    "--sglang-server-concurrency", "--sglang-config"):
                own.setdefault(flag, path)
    scripts = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", full], check=True,
                             capture_output=True, text=True).stdout.split()
    megatron: dict[str, str] = {}
    for path in sorted(p for p in scripts if SCRIPT_PATTERN.match(p)):
        for flag in sorted(script_flags(git_show(repo, full, path))):
            if flag not in own and not flag.startswith(PASSED_THROUGH):
                megatron.setdefault(flag, path)
    print(f"# slime's launch flags at THUDM/slime {full} (tools/extract_slime_flags.py)")
    print("# FLAG<TAB>where: a slime parser file, or the first launch script passing a Megatron flag")
    for flag, where in list(own.items()) + sorted(megatron.items()):
        print(f"{flag}\t{where}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
