"""--save-hf DIR: after each checkpoint of --save, its HF model in DIR/step_N (N: the checkpoint's
iteration), written by the project's converter (`python -m lean_rl.convert megatron-to-hf`: streaming,
LoRA merged, a reward model as its *ForSequenceClassification) in a child process, so that the
training loop does not wait for it and the conversion's memory is not the driver's.

The converter writes into a hidden sibling directory and renames it to DIR/step_N when complete
(convert/output_dir.py), so DIR/step_N is either absent or whole. A failed export is reported as one
line naming the step and the converter's own error, when the next checkpoint is saved or at exit; the
run waits for the exports still running at exit (each within EXPORT_DEADLINE_S)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lean_rl.backends.megatron.train_config import CheckpointConfig

logger = logging.getLogger(__name__)

EXPORT_DEADLINE_S = 3600.0  # a conversion streams the weights once; an hour is past any sane model's
LOG_TAIL_CHARS = 2000


@dataclass
class _Export:
    step: int
    target: Path
    log_path: Path
    process: subprocess.Popen
    started: float


class HfExports:
    """The HF exports of one run: started after each checkpoint, reaped later, awaited at exit."""

    def __init__(self, save_hf: str | Path, save: str | Path, *, hf_config: str | Path | None = None,
                 python: str = sys.executable, deadline_s: float = EXPORT_DEADLINE_S):
        self.root, self.save, self.python, self.deadline_s = Path(save_hf), Path(save), python, deadline_s
        self.hf_config = hf_config  # config.json + tokenizer; None: the checkpoint's own hf_config/ folder
        self.running: list[_Export] = []
        self.failures: list[str] = []  # one line per failed export, in the order they were noticed
        self.written: list[Path] = []

    def target(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def start(self, step: int) -> None:
        """Converts --save's checkpoint of iteration `step` into DIR/step_N, in the background."""
        self.reap()
        target = self.target(step)
        self.root.mkdir(parents=True, exist_ok=True)
        log_path = self.root / f".step_{step}.log"  # the converter's output, kept only when it fails
        command = [self.python, "-m", "lean_rl.convert", "megatron-to-hf", "--load", str(self.save),
                   "--iteration", str(step), "--save", str(target)]
        if self.hf_config is not None:
            command += ["--hf-config", str(self.hf_config)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        self.running.append(_Export(step, target, log_path, process, time.monotonic()))
        logger.info("--save-hf: writing step %d's HF model to %s (pid %d)", step, target, process.pid)

    def reap(self) -> list[str]:
        """Collects the finished exports; returns the failures among them (each also logged)."""
        still, failed = [], []
        for export in self.running:
            code = export.process.poll()
            if code is None and time.monotonic() - export.started > self.deadline_s:
                export.process.kill()
                code = export.process.wait()
                for partial in self.root.glob(f".{export.target.name}.partial-{export.process.pid}"):
                    shutil.rmtree(partial, ignore_errors=True)  # killed: the converter's own cleanup did not run
                failed.append(self._failed(export, f"not done after {self.deadline_s:.0f}s; stopped"))
            elif code is None:
                still.append(export)
            elif code != 0:
                failed.append(self._failed(export, _last_line(export.log_path) or f"exit status {code}"))
            else:
                export.log_path.unlink(missing_ok=True)
                self.written.append(export.target)
                logger.info("--save-hf: wrote %s in %.1fs", export.target, time.monotonic() - export.started)
        self.running = still
        self.failures += failed
        return failed

    def wait_all(self) -> list[str]:
        """Waits for every running export (each within its deadline); returns the failures among them."""
        failed: list[str] = []
        while self.running:
            failed += self.reap()
            if self.running:
                time.sleep(0.2)
        return failed

    def _failed(self, export: _Export, why: str) -> str:
        line = f"--save-hf: step {export.step}'s HF model was not written to {export.target}: {why}"
        logger.error("%s (the converter's output: %s)", line, export.log_path)
        return line


def _last_line(path: Path) -> str:
    """The converter's one-line error (`megatron_to_hf: error: ...`), the last line of its output."""
    try:
        text = path.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class CheckpointHfExports:
    """--save-hf for the run's checkpoints: the actor's into DIR/step_N, the PPO critic's (a value head:
    the converter writes its *ForSequenceClassification) into DIR/critic/step_N."""

    def __init__(self, ckpt: CheckpointConfig):
        if ckpt.save_hf is None or ckpt.save is None:
            raise ValueError("CheckpointHfExports: needs --save-hf and --save")
        self.keep_last = ckpt.keep_last_checkpoints
        # the trainer's checkpoints carry no HF side files: those of the run's --hf-checkpoint
        self.actor = HfExports(ckpt.save_hf, ckpt.save, hf_config=ckpt.hf_checkpoint)
        self.critic = HfExports(Path(ckpt.save_hf) / "critic", ckpt.critic_save_dir or Path(ckpt.save) / "critic",
                                hf_config=ckpt.hf_checkpoint)

    def before_save(self) -> None:
        """With --keep-last-checkpoints a save deletes old iterations, which a running export may still
        be reading: those finish first (on the save's thread; the event loop keeps serving)."""
        if self.keep_last is not None:
            self.actor.wait_all()
            self.critic.wait_all()

    def after_save(self, step: int, with_critic: bool) -> None:
        if with_critic:
            self.critic.start(step)
        self.actor.start(step)

    def close(self) -> list[str]:
        """At exit: waits for the exports still running; returns every failure of the run."""
        self.actor.wait_all()
        self.critic.wait_all()
        return self.critic.failures + self.actor.failures
