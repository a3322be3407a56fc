"""Signals during a checkpoint save (lean_rl/stop.py, Runtime.save): the save runs off the event loop
and signals are read by a thread of their own, so during a 6 s save SIGINT / SIGTERM is noted at once
and the run stops right after the save, a second signal exits at once, and the --stop-timeout
watchdog fires on time. The run is run_loop.run with a stand-in trainer whose save sleeps
(slow_save_run.py: the subject is the loop around a save, not Megatron's checkpoint writer)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = Path(__file__).with_name("slow_save_run.py")
REPO = Path(__file__).resolve().parents[2]
SAVE_S = 6.0


@pytest.fixture
def flags(tiny_qwen2, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data), "--output-dir", str(tmp_path / "out"),
            "--save", str(tmp_path / "ckpt"), "--save-interval", "1", "--num-rollout", "5"]


class SlowSave:
    """The run in a subprocess, its output read line by line."""

    def __init__(self, flags: list[str], save_s: float = SAVE_S):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen([sys.executable, str(RUN), str(save_s), *flags], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []

    def wait_for(self, text: str, timeout_s: float = 120) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append((time.monotonic(), line.rstrip()))
            if line.rstrip() == text:
                return self.lines[-1][0]
        self.proc.kill()
        raise AssertionError(f"no {text!r} in the output:\n" + "\n".join(l for _, l in self.lines[-40:]))

    def finish(self, timeout_s: float = 60) -> tuple[int, float]:
        """(exit status, when it exited), the rest of the output read."""
        rest, _ = self.proc.communicate(timeout=timeout_s)
        ended = time.monotonic()
        self.lines += [(ended, line) for line in rest.splitlines()]
        return self.proc.returncode, ended

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def ticks_between(self, start: float, end: float) -> int:
        return sum(1 for t, line in self.lines if line == "tick" and start < t < end)


def test_sigint_during_a_save_stops_after_it_and_the_loop_keeps_running(flags):
    run = SlowSave(flags)
    run.wait_for("saving 1")
    time.sleep(0.5)
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    saved = run.wait_for("saved 1")
    status, ended = run.finish()
    print(f"SIGINT to exit during a {SAVE_S:g} s save: {ended - sent:.2f} s (the save ended {saved - sent:.2f} s "
          "after the signal)")
    out = run.output()
    assert status == 128 + signal.SIGINT, out
    assert "SIGINT: stopping at the next step boundary" in out
    assert "saving 2" not in out  # stopped at the boundary after the save: no step 2
    assert "stopped by SIGINT with 1 rollouts trained" in out
    assert ended - sent < SAVE_S + 10  # the save's rest, then close: no second wait
    # the event loop ran while the checkpoint was written (ticks every 0.1 s: a blocked loop prints none)
    assert run.ticks_between(sent, saved) >= 10, out


def test_a_second_sigint_during_a_save_exits_at_once(flags):
    run = SlowSave(flags, save_s=30)
    run.wait_for("saving 1")
    run.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    second = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    status, ended = run.finish()
    out = run.output()
    assert status == 128 + signal.SIGINT, out
    assert "SIGINT again: exiting now" in out
    assert "saved 1" not in out
    assert ended - second < 5.0, f"{ended - second:.2f} s"  # the save had 29 s to go (a loaded machine: slack)


def test_the_stop_timeout_watchdog_fires_during_a_save(flags):
    run = SlowSave([*flags, "--stop-timeout", "1"], save_s=60)
    run.wait_for("saving 1")
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    status, ended = run.finish()
    out = run.output()
    assert status == 128 + signal.SIGTERM, out
    assert "not stopped within --stop-timeout 1 s: exiting now" in out
    assert "saved 1" not in out
    assert 0.9 < ended - sent < 10.0, f"{ended - sent:.2f} s"  # the save had 60 s to go (slack: a loaded machine)
