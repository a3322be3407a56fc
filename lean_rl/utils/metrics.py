"""Per-step timers and metrics: console (rich), metrics.jsonl, tensorboard, and wandb when asked.

metrics.jsonl is appended to, one line per step (flushed and fsynced), so a resumed run continues
the same file; on resume the lines of steps at or after the resume step (written after the last
checkpoint) are dropped first, and so is a line a kill -9 tore mid-write (said so in a log line):
the file is rewritten atomically (a temporary file, fsynced, renamed over it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Iterator

logger = logging.getLogger(__name__)

# What the console shows each step, as (metric, label, format); everything goes to the files.
CONSOLE_KEYS = (
    ("step", "step", "{:d}"), ("rollout/reward_mean", "reward", "{:.3f}"),
    ("rollout/response_len_mean", "len", "{:.1f}"), ("train/loss", "loss", "{:+.4f}"), ("train/kl_loss", "kl", "{:.4f}"),
    ("train/entropy", "entropy", "{:.3f}"), ("train/staleness_max", "stale", "{:.0f}"), ("time/step", "step_s", "{:.1f}"),
    ("time/generate", "gen_s", "{:.1f}"), ("time/train", "train_s", "{:.2f}"), ("time/sync", "sync_s", "{:.2f}"),
)


class Timers:
    """Named wall-clock timers: `with timers("train"): ...`; `pop()` returns {"time/train": s, ...}."""

    def __init__(self):
        self._seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] += seconds

    def pop(self) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self._seconds.items()}
        self._seconds.clear()
        return out


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of the run in `run_dir`: the one it wrote there at its first start, else a new one
    (written now), so that a resumed run logs into the same W&B run."""
    path = run_dir / "wandb_run_id"
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = secrets.token_hex(8)  # W&B ids: up to 64 of [a-z0-9_-]
    path.write_text(run_id + "\n")
    return run_id


class MetricsLogger:
    def __init__(self, run_dir: str | Path, resume_step: int = 0, tensorboard: bool = True,
                 wandb_project: str | None = None, wandb_run_name: str | None = None, config: dict | None = None,
                 console: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._truncate_from(resume_step)
        self.on_row: Callable[[dict[str, float]], None] | None = None  # each row as written (lean_rl/api.py)
        self._console = None
        if console:
            from rich.console import Console

            self._console = Console(highlight=False, soft_wrap=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=resume_step or None)
        self._wandb = None
        if wandb_project:
            import wandb  # optional: installed by the user when they ask for --use-wandb

            # a rerun on the same --output-dir (a resume) continues the same W&B run
            self._wandb = wandb.init(project=wandb_project, name=wandb_run_name, config=config or {},
                                     dir=str(self.run_dir), id=wandb_run_id(self.run_dir), resume="allow")

    def rewind(self, step: int) -> None:
        """Steps from `step` on will be logged again (a trainer heal went back to its checkpoint)."""
        self._truncate_from(step)

    def _truncate_from(self, step: int) -> None:
        """Keep the rows of steps before `step`; drop the rest and any torn line (logged)."""
        for stale in self.run_dir.glob(f".{self.path.name}.tmp-*"):  # a rewrite a kill interrupted
            stale.unlink(missing_ok=True)
        if not self.path.exists():
            return
        text = self.path.read_text(errors="replace")
        rows, torn = _parse_rows(text)
        for number, line in torn:
            logger.warning("%s: line %d is torn (a run was killed while writing it), dropped: %.80r",
                           self.path, number, line)
        kept = [line for line, row in rows if row["step"] < step]
        new_text = "".join(line + "\n" for line in kept)
        if new_text != text:
            _replace_file(self.path, new_text)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items() if _is_number(v)}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.on_row is not None:
            self.on_row(row)
        if self._tb is not None:
            for key, value in row.items():
                if key != "step":
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        if self._console is not None:
            parts = [f"{label} {fmt.format(int(row[key]) if fmt == '{:d}' else row[key])}"
                     for key, label, fmt in CONSOLE_KEYS if key in row]
            parts[2:2] = [f"eval:{key.split('/')[1]} {row[key]:.3f}" for key in row
                          if key.startswith("eval/") and key.endswith("/reward_mean")]
            self._console.print(" | ".join(parts))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def _parse_rows(text: str) -> tuple[list[tuple[str, dict]], list[tuple[int, str]]]:
    """(line, row) of each complete row of metrics.jsonl text, and (1-based number, line) of each torn
    one: a line that is not a JSON object with a "step" (a write cut short by a kill; the line after
    a torn one may have been appended to it, so any such line is dropped, not only the last)."""
    rows, torn = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append((line, row))
        else:
            torn.append((number, line))
    return rows, torn


def _replace_file(path: Path, text: str) -> None:
    """Write `path` atomically: a kill -9 leaves the old content or the new, never a truncated file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot fsync a directory
        pass
    finally:
        os.close(fd)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of run_dir/metrics.jsonl (a torn line, from a killed run, is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    return [row for _, row in _parse_rows(path.read_text(errors="replace"))[0]] if path.exists() else []


def dump_samples(run_dir: str | Path, step: int, groups: list) -> Path:
    """Every sample of a step as one JSON line each (samples/step_000123.jsonl)."""
    path = Path(run_dir) / "samples" / f"step_{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for group in groups:
            for sample in group:
                f.write(json.dumps(sample.to_dict()) + "\n")
    return path


def setup_logging() -> None:
    """lean_rl's own INFO messages (start-up, resume, engine restarts) on stderr, once per process."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger("lean_rl")
    if not root.handlers:
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def print_run_summary(run_dir: str | Path) -> None:
    """The reward curve of the run in one glance, and where the metrics are."""
    rows = [r for r in read_metrics(run_dir) if "rollout/reward_mean" in r]
    if not rows:
        return
    rewards = [r["rollout/reward_mean"] for r in rows]
    every = max(len(rewards) // 10, 1)
    curve = " ".join(f"{r:.2f}" for r in rewards[::every])
    print(f"reward over {len(rewards)} steps (every {every}): {curve} -> last {rewards[-1]:.3f}\n"
          f"metrics: {Path(run_dir) / 'metrics.jsonl'} (tensorboard: {Path(run_dir) / 'tensorboard'})", flush=True)
