"""scripts/setup.sh talks: each step prints a line with the time since the start, a failed pip says
so and stops, and the last line says how to run the main job and the tests. The real script on this
machine; the failing install uses a fresh venv in a temporary directory with pip cut off from every
index (PIP_NO_INDEX), so it fails at its first package in seconds and the project's .venv is untouched."""

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^setup\.sh \[\+(\d+)s\] (.*)$")


def run_setup(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)


def test_up_to_date_venv_says_what_to_run_next():
    result = run_setup({})
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert "up to date" in last and "bash scripts/quickstart.sh" in last and "bash scripts/test.sh" in last


def test_fresh_install_prints_its_steps_and_stops_on_a_pip_failure(tmp_path):
    stamp = (REPO / ".venv" / ".lean_rl-setup-stamp").read_text()
    result = run_setup({"LEAN_RL_VENV": str(tmp_path / "venv"), "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
                        "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert result.returncode == 1
    steps = [STEP.match(line) for line in result.stdout.splitlines()]
    assert all(steps), result.stdout  # every line of its own is a timed step
    texts = [m.group(2) for m in steps]
    first = next(i for i, text in enumerate(texts) if text.startswith("creating"))
    # before the venv: the system packages tool calls need (bubblewrap, libseccomp2, cgroup-tools), found or installed
    packages = ("bubblewrap", "libseccomp2", "cgroup-tools")
    assert all(text.startswith(packages + tuple(f"installing {p}" for p in packages)) for text in texts[:first]), \
        texts[:first]
    assert texts[first].startswith(f"creating {tmp_path / 'venv'}")
    assert texts[first + 1].startswith("installing the pinned CPU set (requirements.txt")
    seconds = [int(m.group(1)) for m in steps]
    assert seconds == sorted(seconds)
    assert "setup.sh: pip could not install requirements.txt" in result.stderr
    assert not (tmp_path / "venv" / ".lean_rl-setup-stamp").exists()  # a failed setup is not "up to date"
    assert (REPO / ".venv" / ".lean_rl-setup-stamp").read_text() == stamp
