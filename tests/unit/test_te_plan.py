"""scripts/te-plan.sh, the decision scripts/setup.sh takes on a GPU machine about TransformerEngine
(review 2026-12-06 N3): opt-in, built only with nvcc, and without it one line naming the local layer
spec. Runs the real script with a controlled PATH and CUDA_HOME (no GPU, no venv needed)."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def plan(tmp_path: Path, te: str | None, nvcc_on_path: bool = False, cuda_home: bool = False):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if nvcc_on_path:
        nvcc = bin_dir / "nvcc"
        nvcc.write_text("#!/bin/sh\necho nvcc\n")
        nvcc.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if te is not None:
        env["LEAN_RL_TE"] = te
    if cuda_home:
        home = tmp_path / "cuda"
        (home / "bin").mkdir(parents=True, exist_ok=True)
        (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
        (home / "bin" / "nvcc").chmod(0o755)
        env["CUDA_HOME"] = str(home)
    return subprocess.run(["bash", "scripts/te-plan.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=30)


def test_te_is_opt_in_and_the_default_names_the_local_spec(tmp_path):
    for te in (None, "0"):
        result = plan(tmp_path, te, nvcc_on_path=True)
        assert result.returncode == 0 and result.stdout.count("\n") == 1, result.stderr
        assert result.stdout.startswith("skip: TransformerEngine is opt-in (LEAN_RL_TE=1 builds transformer-engine")
        assert "--transformer-impl local" in result.stdout


def test_an_asked_for_build_needs_nvcc_and_names_it(tmp_path):
    result = plan(tmp_path, "1", nvcc_on_path=True)
    assert result.returncode == 0 and result.stdout.startswith(f"build: nvcc at {tmp_path / 'bin' / 'nvcc'}")
    assert "2.20.2" in result.stdout and "10-30 min" in result.stdout
    result = plan(tmp_path / "home", "1", cuda_home=True)
    assert result.returncode == 0 and result.stdout.startswith(f"build: nvcc at {tmp_path / 'home' / 'cuda'}")


def test_an_asked_for_build_without_nvcc_stops_with_one_line(tmp_path):
    if any(Path(d, "nvcc").exists() for d in ("/usr/bin", "/bin")):
        import pytest

        pytest.skip("this machine has nvcc in /usr/bin")
    result = plan(tmp_path, "1")
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "no nvcc was found" in result.stderr
    assert "--transformer-impl local" in result.stderr
