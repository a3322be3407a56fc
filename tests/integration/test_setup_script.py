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


def test_on_a_gpu_machine_setup_says_in_one_line_that_it_trains_without_transformer_engine(tmp_path):
    """Review 2026-12-06 N3: a GPU machine (nvidia-smi lists a GPU) without LEAN_RL_TE gets the GPU set
    and no TransformerEngine build, said in one line naming --transformer-impl local. pip is cut off
    from every index, so the install stops at its first package; the decision line comes before it."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LEAN_RL_TE"}
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**env, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
                                 "LEAN_RL_VENV": str(tmp_path / "venv"), "PIP_NO_INDEX": "1",
                                 "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "",
                                 "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    texts = [m.group(2) for m in map(STEP.match, result.stdout.splitlines()) if m]
    te = [text for text in texts if "TransformerEngine" in text]
    assert len(te) == 1 and te[0].startswith("GPU machine; TransformerEngine: skip: TransformerEngine is opt-in")
    assert "--transformer-impl local" in te[0] and "LEAN_RL_TE=1" in te[0]
    assert any(text.startswith("installing the pinned GPU set") for text in texts), texts
    assert result.returncode == 1 and "pip could not install requirements-gpu.txt" in result.stderr
