"""metrics.jsonl across a kill: a torn line (a write cut short) never breaks a resume; it is dropped,
said so in a log line, and the rows before it are kept."""

import json
import logging

import pytest

from lean_rl.utils.metrics import MetricsLogger, read_metrics


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(run_dir, text):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir / "metrics.jsonl"


def _lines(*steps):
    return "".join(json.dumps({"step": s, "train/loss": s / 10}) + "\n" for s in steps)


@pytest.mark.parametrize("resume_step, kept", [(0, []), (2, [0, 1]), (5, [0, 1, 2])])
def test_a_torn_last_line_is_dropped_and_said_so(tmp_path, caplog, resume_step, kept):
    path = _write(tmp_path, _lines(0, 1, 2) + '{"step": 3, "train/lo')  # killed mid-write of step 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]  # readers skip it too
    with caplog.at_level(logging.WARNING, logger="lean_rl"):
        logger = MetricsLogger(tmp_path, resume_step=resume_step, tensorboard=False, console=False)
    assert [r["step"] for r in _rows(path)] == kept
    assert any("line 4 is torn" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    logger.log(resume_step, {"train/loss": 0.5})  # the resumed run appends on a clean line
    assert [r["step"] for r in _rows(path)] == [*kept, resume_step]
    assert read_metrics(tmp_path)[-1] == {"step": resume_step, "train/loss": 0.5}


def test_a_torn_line_something_was_appended_to_is_dropped_too(tmp_path, caplog):
    """A run killed mid-line whose file was then appended to without a repair: the merged line goes,
    the lines around it stay."""
    path = _write(tmp_path, _lines(0) + '{"step": 1, "x' + _lines(1, 2))
    with caplog.at_level(logging.WARNING, logger="lean_rl"):
        MetricsLogger(tmp_path, resume_step=3, tensorboard=False, console=False)
    assert [r["step"] for r in _rows(path)] == [0, 2]
    assert any("line 2 is torn" in r.getMessage() for r in caplog.records)


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path, caplog):
    path = _write(tmp_path, _lines(0, 1).rstrip("\n"))
    with caplog.at_level(logging.WARNING, logger="lean_rl"):
        MetricsLogger(tmp_path, resume_step=2, tensorboard=False, console=False).log(2, {"a": 1.0})
    assert [r["step"] for r in _rows(path)] == [0, 1, 2] and not caplog.records


def test_a_clean_file_is_left_alone_and_the_rewrite_is_atomic(tmp_path):
    path = _write(tmp_path, _lines(0, 1))
    before = path.stat()
    MetricsLogger(tmp_path, resume_step=2, tensorboard=False, console=False)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # nothing to drop: untouched
    (tmp_path / ".metrics.jsonl.tmp-999").write_text("half a rewrite")  # a rewrite killed before its rename
    MetricsLogger(tmp_path, resume_step=1, tensorboard=False, console=False)
    assert [r["step"] for r in _rows(path)] == [0]
    assert path.stat().st_ino != before.st_ino  # replaced by a rename, not truncated in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_rerun_in_the_same_output_dir_continues_the_same_wandb_run(tmp_path):
    from lean_rl.utils.metrics import wandb_run_id

    first = wandb_run_id(tmp_path)
    assert first == wandb_run_id(tmp_path) and (tmp_path / "wandb_run_id").read_text().strip() == first
    assert wandb_run_id(tmp_path / "other" if (tmp_path / "other").mkdir() is None else tmp_path) != first
