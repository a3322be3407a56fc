"""Bad input, as a new user types it: `python -m lean_rl.train` ends with one line
`lean_rl: error: ...` naming what to fix, exit status 2, no traceback, and no process started (no Ray,
no SGLang, no trainer): every check runs before anything starts (lean_rl/preflight.py, lean_rl/cli.py).

"No process started" is observed, not inferred: the command runs with a marker in its environment,
which every process it starts inherits (Ray's GCS and raylet, SGLang servers, workers); while it runs
and after it ends no process but the command itself may carry the marker."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import REPO

MARKER = "LEAN_RL_TEST_MARKER"


def processes_with(marker: str) -> set[int]:
    found = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARKER) == marker:
                found.add(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def run_watched(module: str, args: list[str], timeout_s: float = 120,
                env: dict[str, str] | None = None) -> tuple[int, str, set[int]]:
    """(exit status, stderr, pids of the processes it started) of `python -m module args`."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}), MARKER: marker}
    env.pop("LEAN_RL_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:  # Ray's GCS appears within a second of ray.init: a 0.2 s poll sees it
        started |= processes_with(marker) - {proc.pid}
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{module} {args} still runs after {timeout_s} s")
        time.sleep(0.2)
    _, stderr = proc.communicate()
    started |= processes_with(marker)
    return proc.returncode, stderr, started


def assert_one_line_error(status: int, stderr: str, started: set[int], *expected: str, prog: str = "lean_rl") -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == 2, stderr
    assert "Traceback" not in stderr, stderr
    assert lines and lines[-1].startswith(f"{prog}: error: "), stderr
    for text in expected:
        assert text in lines[-1], lines[-1]
    assert not started, f"processes were started before the error: {started}"


@pytest.fixture(scope="module")
def base(tiny_qwen2, toy_data) -> list[str]:
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(toy_data / "train.jsonl"),
            "--rollout-num-engines", "1", "--num-rollout", "1"]


def test_no_flags():
    assert_one_line_error(*run_watched("lean_rl.train", []), "--prompt-data is required")


def test_malformed_flag_value(base):
    assert_one_line_error(*run_watched("lean_rl.train", [*base, "--lr", "abc"]), "--lr", "'abc'")


def test_missing_dataset_key_is_found_before_ray(base):
    assert_one_line_error(*run_watched("lean_rl.train", [*base, "--input-key", "question"]),
                          "--prompt-data", "missing key 'question' (--input-key)")


def test_dataset_that_the_chat_template_cannot_render(tiny_qwen2, tmp_path):
    """Messages with an unknown role: the tiny tokenizer's template (Qwen-style) renders any role, so
    use a prompt the reader rejects while rendering: a list of messages without --apply-chat-template."""
    data = tmp_path / "messages.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "label": "digits"}) + "\n")
    result = run_watched("lean_rl.train", ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(data)])
    assert_one_line_error(*result, "--prompt-data", ":1:", "--apply-chat-template")


def test_model_dir_without_weights(tiny_qwen2, toy_data, tmp_path):
    broken = tmp_path / "no_weights"
    broken.mkdir()
    for item in tiny_qwen2.iterdir():
        if not item.name.endswith(".safetensors"):
            (broken / item.name).write_bytes(item.read_bytes())
    result = run_watched("lean_rl.train", ["--hf-checkpoint", str(broken), "--prompt-data",
                                           str(toy_data / "train.jsonl")])
    assert_one_line_error(*result, "--hf-checkpoint", "model.safetensors")


def test_damaged_resume_checkpoint(base, tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("garbage\n")
    assert_one_line_error(*run_watched("lean_rl.train", [*base, "--load", str(tmp_path)]), "--load", "garbage")


def test_hook_that_does_not_import(base):
    assert_one_line_error(*run_watched("lean_rl.train", [*base, "--custom-rm-path", "no_such_module.reward"]),
                          "--custom-rm-path", "no_such_module")


def test_port_in_use(base):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_watched("lean_rl.train", [*base, "--router-port", str(port)])
    assert_one_line_error(*result, "--router-port", str(port), "already in use")


def test_save_dir_that_cannot_be_written(base, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert_one_line_error(*run_watched("lean_rl.train", [*base, "--save", str(blocker / "ckpt")]), "--save")


def test_debug_shows_the_traceback(base):
    status, stderr, started = run_watched("lean_rl.train", [*base, "--input-key", "question", "--debug"])
    assert status != 0 and "Traceback" in stderr and "missing key 'question'" in stderr
    assert not started


def test_convert_and_parity_bad_model_dir(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(*run_watched("lean_rl.convert", ["hf-to-megatron", "--hf", str(empty), "--save",
                                                           str(tmp_path / "out")]), prog="hf-to-megatron")
    assert_one_line_error(*run_watched("lean_rl.parity", ["--hf-checkpoint", str(empty)]), "--hf-checkpoint",
                          "config.json", prog="lean_rl.parity")


def test_tools_convert_script_bad_input(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "tools/convert_ckpt/megatron_to_hf.py"), "--load",
                             str(tmp_path / "missing"), "--save", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert_one_line_error(result.returncode, result.stderr, set(), prog="megatron-to-hf")


def test_save_on_a_full_disk_is_refused(tmp_path):
    """The disk-space check, with a model larger than the free space (pure: no process)."""
    from lean_rl.options import ConfigError
    from lean_rl.preflight import CHECKPOINT_BYTES_PER_PARAM, check_save_dir

    free = psutil.disk_usage(str(tmp_path)).free
    with pytest.raises(ConfigError, match="--save .* GiB free"):
        check_save_dir(str(tmp_path / "ckpt"), "--save", free // CHECKPOINT_BYTES_PER_PARAM + 1)
    check_save_dir(str(tmp_path / "ckpt"), "--save", 1000)  # room for a small one
    assert Path(tmp_path / "ckpt").is_dir()


def test_tool_sandbox_that_cannot_be_built(base, tmp_path):
    """The tool-calling example's environment uses lean_rl.rollout.sandbox; with no bwrap on PATH the run
    refuses to start, naming the cause and both fixes (before the model, the data or Ray are touched)."""
    env = {"PATH": str(tmp_path), "PYTHONPATH": f"{REPO}:{REPO / 'examples' / 'tool_calling'}"}
    result = run_watched("lean_rl.train", [*base, "--environment-path", "calculator_env.CalculatorEnv"], env=env)
    assert_one_line_error(*result, "--tool-sandbox bwrap", "no `bwrap` on PATH", "apt-get install bubblewrap",
                          "--tool-sandbox none")


def test_hf_checkpoint_that_does_not_exist(toy_data, tmp_path):
    result = run_watched("lean_rl.train", ["--hf-checkpoint", str(tmp_path / "no-such-model"),
                                           "--prompt-data", str(toy_data / "train.jsonl")])
    assert_one_line_error(*result, f"--hf-checkpoint {tmp_path / 'no-such-model'}: not a directory")


def test_load_that_does_not_exist_and_is_not_save(base, tmp_path):
    result = run_watched("lean_rl.train", [*base, "--load", str(tmp_path / "typo"), "--save", str(tmp_path / "ckpt")])
    assert_one_line_error(*result, f"--load {tmp_path / 'typo'}: no such directory")


HOLD_LOCK = """
import sys, time
from lean_rl.run_lock import DirectoryLock
DirectoryLock(sys.argv[1], "--output-dir").acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_the_same_directory_is_refused(base, tmp_path):
    first = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "run")], cwd=REPO, text=True,
                             stdout=subprocess.PIPE)
    try:
        assert first.stdout.readline().strip() == "held"
        result = run_watched("lean_rl.train", [*base, "--output-dir", str(tmp_path / "run")])
        assert_one_line_error(*result, f"--output-dir {tmp_path / 'run'}: in use by another run (pid {first.pid})")
    finally:
        first.kill()
        first.wait(timeout=30)
