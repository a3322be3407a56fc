"""bench/run_all.py's table (rows in, markdown out) and what the bench scripts share (bench/bench_common.py):
--quick's defaults, the command a row names, the rows written with --json."""

from __future__ import annotations

import json

import pytest

from bench_scripts import import_bench


@pytest.fixture(scope="module")
def bench():
    """bench/run_all.py and bench/bench_common.py, imported as the scripts import them (bench/ on sys.path)."""
    return import_bench("run_all"), import_bench("bench_common")


INFO = dict(machine="Some CPU @ 2.0GHz, 2 cores, 24 GiB RAM, no GPU", commit="abc1234+dirty",
            date="2026-12-01 10:00 UTC", mode="quick")


def test_table_has_the_header_line_columns_and_one_line_per_row(bench):
    run_all, common = bench
    rows = [common.row("weight sync, tiny", "0.240 s", "0.100 s gloo broadcast", 2.4, "<= 1.5", "python bench/weight_sync.py"),
            common.row("capture, own time", "0.55 ms median", "—", None, "—", "python bench/capture_latency.py --quick")]
    text = run_all.render_table(rows, run_all.RunInfo(**INFO, seconds=150.0))
    lines = text.splitlines()
    assert lines[0] == ("Machine: Some CPU @ 2.0GHz, 2 cores, 24 GiB RAM, no GPU. Commit abc1234+dirty, "
                        "2026-12-01 10:00 UTC, mode: quick, 2.5 min in all.")
    assert lines[1] == ""
    assert lines[2] == "| what | figure | floor | ratio | goal | met | command |"
    assert lines[3] == "|---|---|---|---|---|---|---|"
    assert lines[4] == ("| weight sync, tiny | 0.240 s | 0.100 s gloo broadcast | 2.4 | <= 1.5 | NO | "
                        "`python bench/weight_sync.py` |")
    assert lines[5] == ("| capture, own time | 0.55 ms median | — | — | — |  | "
                        "`python bench/capture_latency.py --quick` |")
    assert lines[6:] == ["", "Goals: 0 met, 0 tied within their noise, 0 out of reach here for the reason measured "
                         "beside them, 1 missed."]


def test_ratio_shows_three_significant_digits_and_cells_stay_one_cell(bench):
    run_all, common = bench
    r = common.row("a | b\nc", "x", "y", 1.2759642, "—", "cmd")
    assert run_all.cell(r, "ratio") == "1.28"
    assert run_all.cell(dict(r, ratio=0.0041234), "ratio") == "0.00412"
    assert run_all.cell(r, "what") == "a \\| b c"  # '|' would end the cell, a newline the row


def test_a_failed_script_gets_a_row_with_its_last_stderr_line(bench):
    run_all, _ = bench
    stderr = "Traceback (most recent call last):\n  ...\nRuntimeError: sync failed\n\n"
    reason = f"exit status 1: {run_all.last_line(stderr)}"
    failed = run_all.failed_row("weight_sync", "python bench/weight_sync.py --quick", reason)
    text = run_all.render_table([failed], run_all.RunInfo(**INFO))
    assert text.splitlines()[4] == ("| bench/weight_sync.py | failed: exit status 1: RuntimeError: sync failed | — | — "
                                    "| — |  | `python bench/weight_sync.py --quick` |")
    assert "min in all" not in text.splitlines()[0]  # no duration given, none shown
    assert run_all.last_line("") == "(no stderr)"


def test_commit_name_marks_a_dirty_tree(bench):
    run_all, _ = bench
    assert run_all.commit_name("abc1234", dirty=False) == "abc1234"
    assert run_all.commit_name("abc1234", dirty=True) == "abc1234+dirty"


def test_quick_sets_defaults_and_a_flag_given_wins(bench):
    _, common = bench
    def parser():
        p = common.bench_parser("x", "doc", {"steps": 3, "layouts": "tp1"})
        p.add_argument("--steps", type=common.at_least(2), default=10)
        p.add_argument("--layouts", default="tp1,dp2")
        return p
    assert (parser().parse_args([]).steps, parser().parse_args([]).layouts) == (10, "tp1,dp2")
    quick = common.parse_bench_args(parser(), ["--quick"])
    assert (quick.steps, quick.layouts, quick.quick) == (3, "tp1", True)
    assert common.parse_bench_args(parser(), ["--quick", "--steps", "7"]).steps == 7


def test_bad_flag_value_ends_with_one_line_and_status_2(bench, capsys):
    _, common = bench
    p = common.bench_parser("x", "doc", {})
    p.add_argument("--steps", type=common.at_least(2), default=10)
    with pytest.raises(SystemExit) as exit_:
        common.parse_bench_args(p, ["--steps", "1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["bench/x.py: error: argument --steps: 1 is below 2 (--help lists the flags)"]


def test_command_line_drops_json_and_rows_round_trip(bench, tmp_path):
    _, common = bench
    assert common.command_line("train_step", ["--quick", "--json", "/tmp/x.json", "--steps", "3"]) == \
        "python bench/train_step.py --quick --steps 3"
    assert common.command_line("convert", ["--json=/tmp/x.json", "--workdir", "a b"]) == \
        "python bench/convert.py --workdir 'a b'"
    rows = [common.row("w", "f", "fl", 3, "g", "c"), common.row("w2", "f2", "—", None, "—", "c")]
    common.write_rows(str(tmp_path / "rows.json"), rows)
    back = json.loads((tmp_path / "rows.json").read_text())
    assert back == [{"what": "w", "figure": "f", "floor": "fl", "ratio": 3.0, "goal": "g", "command": "c",
                     "physical_floor": False, "floor_noise": 0.0, "short_of_goal": None},
                    {"what": "w2", "figure": "f2", "floor": "—", "ratio": None, "goal": "—", "command": "c",
                     "physical_floor": False, "floor_noise": 0.0, "short_of_goal": None}]
    assert [list(r) for r in back] == [[*common.ROW_KEYS, common.PHYSICAL, common.NOISE, "short_of_goal"]] * 2


def test_a_row_that_beats_its_physical_floor_is_a_broken_floor(bench):
    _, common = bench
    beaten = common.row("weight sync", "0.47 s", "0.63 s raw TCP send", 0.746, "<= 1.5", "c", physical=True)
    assert "broken floor: ours / floor = 0.746 < 1 for 'weight sync'" in common.broken_floor(beaten)
    assert common.broken_floor(common.row("w", "f", "fl", 1.0, "g", "c", physical=True)) is None
    # ours at the floor, below it by less than the floor's own spread between rounds: a tie
    tie = common.row("rollout", "4025 tok/s", "4013 tok/s", 0.997, "<= 1.1", "c", physical=True, noise=0.02)
    assert common.broken_floor(tie) is None
    beyond = common.row("rollout", "4200 tok/s", "4013 tok/s", 0.955, "<= 1.1", "c", physical=True, noise=0.02)
    assert "0.955 < 1 (more than the floor's spread between rounds, 0.02)" in common.broken_floor(beyond)
    # a ratio below 1 is fine where the floor is not physical (peak memory / a shard, async / sync ...)
    assert common.broken_floor(common.row("rss", "70 MiB", "95 MiB shard", 0.73, "<= 1.06", "c")) is None


def test_the_readme_holds_the_results_file_as_run_all_wrote_it(bench):
    """A figure in the README's bench table is one run's: the run named by bench/RESULTS.md's header."""
    run_all, _ = bench
    assert run_all.readme_table(run_all.README.read_text()) == run_all.DEFAULT_OUT.read_text()


def test_readme_with_table_replaces_only_the_block_between_the_markers(bench):
    run_all, _ = bench
    readme = f"# title\nbefore\n{run_all.README_BEGIN}\nold table\n{run_all.README_END}\nafter\n"
    updated = run_all.readme_with_table(readme, "| new |\n")
    assert updated == f"# title\nbefore\n{run_all.README_BEGIN}\n| new |\n{run_all.README_END}\nafter\n"
    assert run_all.readme_table(updated) == "| new |\n"
    with pytest.raises(ValueError, match="RESULTS"):
        run_all.readme_with_table("# no markers\n", "| new |\n")
