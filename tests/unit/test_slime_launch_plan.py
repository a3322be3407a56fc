"""python -m lean_rl.slime_launch loses no flag: each reaches slime's `args` (and lean_rl, when lean_rl
has the setting), or start-up says in one line that it has no effect here, or the launch stops with
one line. And the engine flags: slime's SGLang spellings that SGLang 0.5.23 renamed or split are
respelled with a notice, and SGLang's / sglang-router's own parsers read the final command lines at
preflight (lean_rl/backends/sglang/flag_check.py). The parsers are the real ones; no server starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lean_rl.backends.sglang.flag_check import check_engine_flags, check_router_flags, check_server_flags
from lean_rl.config import build_parser, parse_config
from lean_rl.options import ConfigError
from lean_rl.slime_args_table import ROWS
from lean_rl.slime_engine_flags import RENAMED, SWITCHES, respell
from lean_rl.slime_flags import PASSED_THROUGH, SLIME_FLAGS
from lean_rl.slime_launch import plan
from lean_rl.slime_namespace import slime_namespace

REPO = Path(__file__).resolve().parents[2]
BASE = ["--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--rollout-batch-size", "4", "--num-rollout", "2"]
LEAN_FLAGS = {option for action in build_parser()._actions for option in action.option_strings}


def sample_tokens(flag: str) -> list[str]:
    """`flag` with a value slime's parser takes and that differs from its default."""
    row = next(r for r in ROWS if flag in r[1])
    _, _, _, kind, type_name, _, default, _, choices = row
    rule = SLIME_FLAGS.get(flag)
    if kind != "store" and kind != "append":
        return [flag]
    if rule is not None and rule.allowed:
        return [flag, rule.allowed[0]]
    if choices:
        return [flag, str(next((c for c in reversed(choices) if c != default), choices[0]))]
    value = {"int": "3" if default != 3 else "5", "float": "0.37", "loads": '{"k": 1}'}.get(type_name or "", "x7")
    return [flag, value]


def slime_script_flags() -> list[str]:
    """slime's argument set and the Megatron flags of its scripts (SLIME_FLAGS), and every other flag of
    slime's parser that neither lean_rl nor the SGLang / router passthrough takes."""
    own = [f for f in SLIME_FLAGS if any(f in r[1] for r in ROWS)]
    others = sorted({f for r in ROWS for f in r[1] if r[0] == "main"} - set(SLIME_FLAGS) - LEAN_FLAGS)
    return own + [f for f in others if not f.startswith(PASSED_THROUGH)]


def test_no_flag_given_to_slime_launch_is_silently_lost():
    flags = slime_script_flags()
    assert len(flags) > 850  # slime's own, its scripts' Megatron flags, the rest of Megatron's parser
    outcomes = {"refused": 0, "lean_rl and args": 0, "notice and args": 0}
    before = slime_namespace(BASE)
    for flag in flags:
        given = sample_tokens(flag)
        try:
            launch = plan("train.py", BASE + given)
        except ConfigError as err:  # a one-line refusal naming the flag
            assert "\n" not in str(err) and flag in str(err), (flag, str(err))
            outcomes["refused"] += 1
            continue
        assert launch.slime_argv[-len(given):] == given, f"{flag} does not reach slime's args"
        args = slime_namespace(launch.slime_argv)
        assert "--slime-argv" in launch.argv and json.loads(launch.argv[launch.argv.index("--slime-argv") + 1]) == \
            launch.slime_argv
        said = [n for n in launch.notices if n.startswith(f"slime flag {flag} ")]
        rule = SLIME_FLAGS.get(flag)
        if rule is None or rule.status == "notice":
            assert len(said) == 1, f"{flag}: accepted without its one-line notice: {launch.notices}"
            assert flag not in launch.argv[:launch.argv.index("--slime-argv")], f"{flag} passed to lean_rl too"
            outcomes["notice and args"] += 1
        else:  # same / mapped: lean_rl's flags say it (or slime's meaning is lean_rl's default)
            assert rule.status in ("same", "mapped"), flag
            if rule.status == "same":
                assert given[0] in launch.argv, f"{flag}: 'same' but not passed to lean_rl"
            outcomes["lean_rl and args"] += 1
        row = next(r for r in ROWS if flag in r[1])
        if row[3] == "store" and len(given) == 2 and row[2] in vars(args) and given[1] != str(row[6]):
            changed = vars(args)[row[2]] != vars(before)[row[2]]
            derived_over = row[2] in ("load", "bf16", "use_distributed_optimizer", "seq_length", "eval_prompt_data")
            assert changed or derived_over, f"{flag} {given[1]}: args.{row[2]} kept slime's default"
    assert all(outcomes.values()), outcomes


def test_a_lean_rl_flag_passes_and_an_unknown_one_is_lean_rls_parser_error(tiny_qwen2, tmp_path):
    launch = plan("train.py", BASE + ["--max-staleness", "2", "--no-such-flag", "1"])
    assert ["--max-staleness", "2"] == launch.argv[8:10] and "--no-such-flag" in launch.argv
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "x"}\n')
    argv = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--rollout-batch-size", "1",
            "--num-rollout", "1", "--no-such-flag", "1"]
    with pytest.raises(ConfigError, match="unrecognized arguments: --no-such-flag 1"):
        parse_config(plan("train.py", argv).argv)


def test_slimes_sglang_spellings_are_respelled_with_a_notice():
    argv, notices = respell(["--sglang-cuda-graph-bs", "1", "2", "4", "8", "--sglang-enable-deepep-moe",
                             "--rollout-num-gpus-per-engine", "2", "--sglang-enable-ep-moe",
                             "--sglang-nsa-decode-backend=flashmla_kv", "--sglang-mem-fraction-static", "0.7"])
    assert argv == ["--sglang-cuda-graph-bs-decode", "1", "2", "4", "8", "--sglang-moe-a2a-backend", "deepep",
                    "--rollout-num-gpus-per-engine", "2", "--sglang-ep-size", "2",
                    "--sglang-dsa-decode-backend=flashmla_kv", "--sglang-mem-fraction-static", "0.7"]
    assert len(notices) == 4 and all(n.startswith("slime flag --sglang-") and "\n" not in n for n in notices)
    launch = plan("train.py", BASE + ["--sglang-cuda-graph-bs", "1", "2"])
    assert launch.argv[8:11] == ["--sglang-cuda-graph-bs-decode", "1", "2"]
    assert slime_namespace(launch.slime_argv).sglang_cuda_graph_bs_decode == [1, 2]


VALUES = {"--sglang-cuda-graph-bs": ["1", "2"], "--sglang-cuda-graph-max-bs": ["8"],
          "--sglang-nsa-decode-backend": ["flashmla_kv"], "--sglang-nsa-prefill-backend": ["flashmla_sparse"],
          "--sglang-fp8-gemm-runner-backend": ["deep_gemm"], "--sglang-mamba-scheduler-strategy": ["extra_buffer"],
          "--sglang-disable-piecewise-cuda-graph": []}


def _server(flag: str, values: list[str]) -> list[str]:
    return ["--model-path", "/m", "--" + flag[len("--sglang-"):], *values]


@pytest.mark.parametrize("old", [*RENAMED, *SWITCHES, "--sglang-enable-ep-moe"])
def test_each_respelled_flag_is_one_sglang_0_5_23_refuses_and_its_new_spelling_one_it_takes(old):
    """The map is the diff of slime's SGLang flags against SGLang 0.5.23's own parser."""
    with pytest.raises(ConfigError, match=rf"^{old}: SGLang 0\.5\.23's parser refuses"):
        check_server_flags(_server(old, VALUES.get(old, [])))
    new, _ = respell([old, *VALUES.get(old, [])])
    check_server_flags(_server(new[0], new[1:]))


def test_sglangs_and_the_routers_parsers_name_the_flag():
    with pytest.raises(ConfigError, match=r"^--sglang-mem-fraction-static: SGLang 0\.5\.23's parser refuses the "
                                          r"engine command line: argument --mem-fraction-static: invalid float"):
        check_server_flags(_server("--sglang-mem-fraction-static", ["lots"]))
    with pytest.raises(ConfigError, match=r"^--router-policy: sglang-router's parser refuses .*invalid choice"):
        check_router_flags(["--host", "127.0.0.1", "--port", "3000", "--policy", "fastest"])
    check_router_flags(["--host", "127.0.0.1", "--port", "3000", "--policy", "round_robin"])


def test_the_runs_engine_command_lines_are_checked(tiny_qwen2, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "x"}\n')
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--output-dir", str(tmp_path / "o")]
    check_engine_flags(parse_config(base).engines)  # lean_rl's own flags (preflight parses only with passthrough)
    check_engine_flags(parse_config(base + ["--lora-rank", "4"]).engines)  # and the adapter's
    check_engine_flags(parse_config(base + ["--sglang-chunked-prefill-size", "64", "--router-policy",
                                            "round_robin"]).engines)
    with pytest.raises(ConfigError, match=r"^--sglang-enable-warp-drive: SGLang .* unrecognized arguments"):
        check_engine_flags(parse_config(base + ["--sglang-enable-warp-drive"]).engines)
    with pytest.raises(ConfigError, match=r"^--router-retries: sglang-router's parser"):
        check_engine_flags(parse_config(base + ["--router-retries", "3"]).engines)


def test_preflight_names_a_bad_engine_flag_and_passes_slimes_respelled_ones(tiny_qwen2, tmp_path):
    from lean_rl.preflight import check_before_start

    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "x"}\n')
    argv = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--rollout-batch-size", "1",
            "--num-rollout", "1", "--sglang-cuda-graph-bs", "1", "2", "--sglang-mem-fraction-static", "0.5"]
    out = ["--output-dir", str(tmp_path / "out")]
    check_before_start(parse_config([*plan("train.py", argv).argv, *out]))  # slime 0.5.15's spelling, respelled
    with pytest.raises(ConfigError, match=r"^--sglang-enable-warp-drive: SGLang 0\.5\.23's parser refuses"):
        check_before_start(parse_config([*plan("train.py", [*argv, "--sglang-enable-warp-drive"]).argv, *out]))


@pytest.mark.slow
def test_a_bad_engine_flag_stops_slime_launch_at_preflight_before_any_engine(tiny_qwen2, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "x"}\n')
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "lean_rl.slime_launch", "train.py", "--hf-checkpoint", str(tiny_qwen2), "--prompt-data",
         str(data), "--rollout-batch-size", "1", "--num-rollout", "1", "--output-dir", str(out),
         "--sglang-enable-warp-drive"], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lean_rl: error: --sglang-enable-warp-drive: SGLang 0.5.23's parser refuses"), last
    assert "starting Ray" not in result.stderr and not list(out.rglob("*engine*"))
