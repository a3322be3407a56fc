"""lean_rl.plot: the curves PNG of a run from its metrics.jsonl (the key names the loops really log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lean_rl.plot import NoMetricsError, phase_keys, plot_run, series, write_run_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVAL_STEPS = (4, 9)


def sync_run_rows(steps: int = 10) -> list[dict]:
    """Rows as train.py logs them: rollout, trainer, sync and timers; eval sets every 5 steps."""
    rows = []
    for step in range(steps):
        row = {"step": step, "rollout/reward_mean": step / steps, "rollout/reward_std": 0.1,
               "rollout/response_len_mean": 100.0 + step, "train/ppo_kl": 1e-3 * step, "train/kl_loss": 2e-3,
               "sync/probe_max_abs_diff": 1e-5, "time/generate": 2.0, "time/train": 1.0, "time/sync": 0.5,
               "time/sync_probe": 0.1, "time/step": 3.6, "time/trainer_idle": 2.6, "time/engine_idle": 1.6}
        if step in EVAL_STEPS:
            row.update({"eval/gsm8k/reward_mean": 0.3, "eval/gsm8k/response_len_mean": 90.0,
                        "eval/math/reward_mean": 0.2, "time/eval": 4.0})
            row["time/step"] += 4.0
        rows.append(row)
    return rows


def write_metrics(run_dir: Path, rows: list[dict], torn_tail: str = "") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + torn_tail)
    return path


def assert_png(path: Path, min_bytes: int = 20_000) -> Image.Image:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path}: only {len(data)} bytes, nothing drawn?"
    image = Image.open(path)
    image.load()  # decodes every chunk: a truncated file fails here
    return image


def test_sync_run_draws_its_panels_and_skips_a_torn_last_line(tmp_path):
    write_metrics(tmp_path, sync_run_rows(), torn_tail='{"step": 10, "rollout/reward_me')
    titles = plot_run(tmp_path)
    # no staleness / off-policy panels: a sync run without TIS logs none of their metrics
    assert titles == ["reward", "eval reward", "KL", "train-inference mismatch", "response length (tokens)",
                      "step time (s)"]
    assert_png(tmp_path / "curves.png")


def test_out_path_and_a_run_with_only_reward_and_timers(tmp_path):
    rows = [{"step": s, "rollout/reward_mean": 0.1 * s, "time/generate": 1.0, "time/step": 1.2} for s in range(5)]
    write_metrics(tmp_path / "run", rows)
    out = tmp_path / "elsewhere.png"
    assert plot_run(tmp_path / "run", out) == ["reward", "step time (s)"]
    assert_png(out, min_bytes=10_000)
    assert not (tmp_path / "run" / "curves.png").exists()


def test_spare_grid_cell_of_an_odd_panel_count_is_left_blank(tmp_path):
    rows = [{"step": s, "rollout/reward_mean": 0.1 * s, "rollout/response_len_mean": 50.0 + s,
             "time/train": 1.0} for s in range(5)]
    write_metrics(tmp_path, rows)
    assert len(plot_run(tmp_path)) == 3  # a 2 x 2 grid: the bottom-right cell must have no axes
    pixels = np.asarray(assert_png(tmp_path / "curves.png", min_bytes=10_000).convert("L"))
    height, width = pixels.shape
    bottom_right = pixels[height // 2 + 20:, width // 2 + 20:]
    bottom_left = pixels[height // 2 + 20:, :width // 2 - 20]
    assert bottom_right.min() == 255, "an empty axes frame was drawn in the spare cell"
    assert bottom_left.min() < 128  # the third panel is there


def test_async_run_gets_staleness_and_off_policy_panels(tmp_path):
    rows = [{"step": s, "rollout/reward_mean": 0.5, "train/staleness_max": 1.0, "train/staleness_mean": 0.5,
             "rollout/stale_token_frac": 0.3, "train/tis_clipfrac": 0.01, "time/wait_for_data": 0.2,
             "time/train": 1.0, "time/sync": 0.3, "time/step": 1.6} for s in range(4)]
    write_metrics(tmp_path, rows)
    assert plot_run(tmp_path) == ["reward", "off-policy tokens", "staleness (policy versions)", "step time (s)"]


def test_phase_keys_leave_out_the_total_idle_times_and_the_probe_inside_sync():
    # sync_probe is timed inside time/sync, idle times overlap the phases: stacking them would double-count
    assert phase_keys(sync_run_rows()) == ["time/generate", "time/train", "time/sync", "time/eval"]


def test_series_has_the_steps_where_the_key_exists():
    assert series(sync_run_rows(), "eval/gsm8k/reward_mean") == (list(EVAL_STEPS), [0.3, 0.3])


def test_no_file_no_rows_nothing_to_plot(tmp_path):
    with pytest.raises(NoMetricsError, match="metrics.jsonl: no such file"):
        plot_run(tmp_path)
    write_metrics(tmp_path, [], torn_tail='{"step": 0, "rollout/rew')  # a run killed during its first write
    with pytest.raises(NoMetricsError, match="metrics.jsonl: no rows"):
        plot_run(tmp_path)
    write_metrics(tmp_path, [{"step": 0, "buffer/groups_trained": 8.0}])
    with pytest.raises(NoMetricsError, match="none of the metrics this plots"):
        plot_run(tmp_path)
    assert not (tmp_path / "curves.png").exists()


def test_write_run_curves_warns_instead_of_failing(tmp_path, caplog):
    write_run_curves(tmp_path / "missing")
    assert "could not write" in caplog.text and "no such file" in caplog.text


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lean_rl.plot", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_cli_missing_metrics_exits_2_naming_the_file(tmp_path):
    result = run_cli(str(tmp_path))
    assert result.returncode == 2
    assert str(tmp_path / "metrics.jsonl") in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_writes_the_default_png(tmp_path):
    write_metrics(tmp_path, sync_run_rows())
    result = run_cli(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "reward, eval reward" in result.stdout
    assert_png(tmp_path / "curves.png")


def test_a_multi_turn_run_draws_its_turns(tmp_path):
    rows = [{"step": s, "rollout/reward_mean": 0.1 * s, "rollout/turns_mean": 2.5, "rollout/turns_max": 4.0,
             "rollout/multi_turn_fraction": 0.2 * s, "eval/toy/reward/reward_mean": 0.5} for s in range(4)]
    write_metrics(tmp_path, rows)
    # an eval reward-dict entry named "reward" (eval/<set>/reward/reward_mean) is not an eval set
    assert plot_run(tmp_path) == ["reward", "turns per trajectory", "episodes that act (a tool call, a search)"]
