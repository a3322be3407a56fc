"""Write the namespaces slime's own parser builds for some of slime's launch scripts (flags only), as
test data for tests/unit/test_slime_namespace.py:

    python tools/slime_expected_args.py /work/.mirror/THUDM+slime/repo 624b824 \
        /work/.mirror/NVIDIA+Megatron-LM/repo tests/unit/slime_expected_args

Each script's train.py flags are read by bash (its arrays and the model script it sources), spelled
as SGLang 0.5.23 needs them (lean_rl.slime_engine_flags.respell, as lean_rl.slime_launch does), and
parsed by slime's parse_args, run from slime's source at that commit with the Megatron-LM slime's
Dockerfile pins (tools/extract_slime_args.py extracts both). Left out, as lean_rl leaves them out:
the HF config check (no model here) and Megatron's own validate_args (slime's part of it runs).
Paths under /root/ are parsed as temporary directories (slime checks --ref-load exists) and written
back as /root/ paths. Offline only: lean_rl never imports slime."""

from __future__ import annotations

import contextlib
import enum
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SCRIPTS = ("scripts/run-qwen3-4B.sh", "scripts/run-qwen3-30B-A3B.sh", "scripts/run-qwen3-4B-base-sft.sh", "scripts/run-glm4.7-30B-A3B.sh",
           "examples/search-r1/run_qwen2.5_3B.sh", "examples/fully_async/run-qwen2.5-0.5B-fully_async.sh",
           "examples/retool/retool_qwen3_4b_rl.sh")
# the script's own definitions, in order: arrays, `source` of a model script, plain assignments
DEFINITION = re.compile(r"^\s*[A-Z_][A-Z0-9_]*=\(.*?^\s*\)|^\s*source\s+.*$|^[A-Z_][A-Z0-9_]*=(?!.*\$\((?!\()).*$",
                        re.S | re.M)
TRAIN_CALL = re.compile(r"train(?:_async)?\.py(.*?)(?:\n\s*\n|\Z)", re.S)


# command lines of our own (flags slime's scripts rarely pass, the cases issue 38 names)
OWN = {"issue-38": ["--hf-checkpoint", "/root/Qwen3-4B", "--prompt-data", "/root/d.jsonl", "--num-rollout", "3",
                    "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--rollout-max-context-len", "1024",
                    "--eval-max-response-len", "64", "--eval-temperature", "0.5", "--rollout-temperature", "0.9",
                    "--eval-prompt-data", "/root/aime.jsonl", "--eval-interval", "5", "--colocate", "--offload",
                    "--num-steps-per-rollout", "2", "--dump-details", "/root/dump", "--sglang-cuda-graph-bs", "1",
                    "2", "4", "--sglang-enable-deepep-moe", "--sglang-router-request-timeout-secs", "60",
                    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048", "--advantage-estimator", "ppo",
                    "--vocab-size", "1000", "--tensor-model-parallel-size", "2", "--eps-clip", "0.3",
                    "--moe-token-dispatcher-type", "allgather", "--reward-key", "score", "--router-policy",
                    "round_robin", "--sglang-pp-size", "1", "--rollout-num-gpus-per-engine", "2"]}


def script_argv(slime_dir: pathlib.Path, path: str) -> tuple[str, list[str]]:
    """(launcher, flags) of the script's train.py / train_async.py call, expanded by bash."""
    text = (slime_dir / path).read_text()
    call = TRAIN_CALL.search(text)
    assert call is not None, path
    launcher = "train_async.py" if "train_async.py" in call.group(0) else "train.py"
    body = call.group(1).split("\n")
    tail = "\n".join(line for line in body if line.strip() and not line.strip().startswith("#"))
    program = "\n".join([f'SCRIPT_DIR="{slime_dir / pathlib.Path(path).parent}"', "NUM_GPUS=8", "MASTER_ADDR=127.0.0.1", "WANDB_KEY=wandb-key",
                         *[d for d in DEFINITION.findall(text) if not d.startswith("SCRIPT_DIR")], f"printf '%s\\n' {tail}"])
    out = subprocess.run(["bash", "-c", program], check=True, capture_output=True, text=True).stdout
    return launcher, [token for token in out.split("\n") if token]


def plain(value):
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return getattr(value, "__name__", repr(value))


def slime_args(argv: list[str], scratch: pathlib.Path) -> dict:
    import slime.backends.megatron_utils.arguments as megatron_arguments
    from slime.utils.arguments import parse_args

    megatron_arguments._hf_validate_args = lambda args, hf_config: None  # no model here
    megatron_arguments.AutoConfig = types.SimpleNamespace(from_pretrained=lambda *a, **k: None)
    megatron_arguments._megatron_validate_args = lambda args: None  # Megatron's own: not lean_rl's to mirror
    local = [t.replace("/root/", f"{scratch}/root/") for t in argv]
    for flag, value in zip(local, local[1:]):
        if flag in ("--ref-load", "--opd-teacher-load"):
            pathlib.Path(value).mkdir(parents=True, exist_ok=True)
    sys.argv = ["train.py", *local]
    with contextlib.redirect_stdout(sys.stderr):
        args = parse_args()
    values = {k: plain(v) for k, v in vars(args).items() if k != "eval_datasets"}
    return json.loads(json.dumps(values).replace(f"{scratch}/root/", "/root/"))


def main(slime_repo: str, commit: str, megatron_repo: str, out_dir: str) -> None:
    from extract_slime_args import build_paths

    repo_root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo_root))
    from lean_rl.slime_engine_flags import respell

    with tempfile.TemporaryDirectory() as tmp:
        slime_dir, megatron_dir = build_paths(slime_repo, commit, megatron_repo, pathlib.Path(tmp))
        sys.path[:0] = [str(megatron_dir), str(slime_dir)]
        sys.modules.setdefault("wandb", types.ModuleType("wandb"))
        cases = [(path, *script_argv(slime_dir, path)) for path in SCRIPTS]
        cases += [(name, "train.py", argv) for name, argv in OWN.items()]
        for path, launcher, argv in cases:
            argv, _ = respell(argv)
            expected = slime_args(argv, pathlib.Path(tmp, "scratch"))
            name = pathlib.Path(path).stem
            record = {"script": path, "slime_commit": commit, "launcher": launcher, "argv": argv, "args": expected}
            pathlib.Path(out_dir, f"{name}.json").write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
            print(f"{path}: {len(argv)} tokens, {len(expected)} attributes", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:5])
