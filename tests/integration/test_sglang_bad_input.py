"""Bad input to the engine group: each case fails with a clear error and leaves no process behind."""

import json
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from lean_rl.backends.sglang import engines as engines_module
from lean_rl.backends.sglang.engines import EngineGroup, EngineStartError
from lean_rl.backends.sglang.model_check import ModelDirError
from lean_rl.utils.net import find_free_port

from lean_rl.testing.sglang_engines import engine_config_for_tests

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]  # engines are Ray actors


def assert_all_gone(pids, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert time.monotonic() < deadline, f"processes {alive} outlived their engine group"
        time.sleep(0.1)


def one_engine(model_path, *flags):
    return engine_config_for_tests(model_path, "--rollout-num-engines", "1", *flags)


@pytest.fixture
def broken_model(tiny_qwen2, tmp_path):
    return shutil.copytree(tiny_qwen2, tmp_path / "model")


def test_missing_model_dir_fails_before_starting_anything(tmp_path):
    group = EngineGroup(one_engine(tmp_path / "no-such-model"), tmp_path / "run")
    with pytest.raises(ModelDirError, match=rf"--hf-checkpoint: model directory {tmp_path}/no-such-model does not exist"):
        group.start()
    assert group.pids() == {}


def test_model_dir_without_tokenizer_fails_before_starting_anything(broken_model, tmp_path):
    (broken_model / "tokenizer.json").unlink()
    group = EngineGroup(one_engine(broken_model), tmp_path / "run")
    with pytest.raises(ModelDirError, match="has no tokenizer"):
        group.start()
    assert group.pids() == {}


def test_unsupported_architecture_fails_before_starting_anything(broken_model, tmp_path):
    config = json.loads((broken_model / "config.json").read_text())
    config["architectures"] = ["FooBarForCausalLM"]
    (broken_model / "config.json").write_text(json.dumps(config))
    group = EngineGroup(one_engine(broken_model), tmp_path / "run")
    with pytest.raises(ModelDirError, match="architecture FooBarForCausalLM is not supported by SGLang"):
        group.start()
    assert group.pids() == {}


@pytest.mark.parametrize("flag", ["--sglang-base-port", "--router-port"])
def test_a_taken_port_is_reported_with_its_flag(tiny_qwen2, tmp_path, flag):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        group = EngineGroup(one_engine(tiny_qwen2, flag, str(port)), tmp_path / "run")
        with pytest.raises(ValueError, match=rf"^{flag}: port {port} on 127.0.0.1 is already in use"):
            group.start()
    assert group.pids() == {}


def server_tmp_dirs(run_dir: Path) -> set:
    return {*Path(tempfile.gettempdir()).glob("lean_rl_sglang*"), *run_dir.glob("lean_rl_sglang*")}


def test_a_server_that_dies_at_start_raises_with_its_log_tail(broken_model, tmp_path):
    (broken_model / "model.safetensors").write_bytes(b"this is not a safetensors file")
    tmp_dirs_before = server_tmp_dirs(tmp_path / "run")
    group = EngineGroup(one_engine(broken_model), tmp_path / "run")
    with pytest.raises(EngineStartError, match=r"(?s)engine-0 exited with code -?\d+ while starting: "
                                               r"\S*SafetensorError: .*last lines of .*engine-0.log"):
        group.start()
    assert all(pids == [] for pids in group.pids().values()), group.pids()  # the router was stopped too
    assert server_tmp_dirs(tmp_path / "run") <= tmp_dirs_before  # its TMPDIR (SGLang ipc files) is gone


# slow (suite time): the race is simulated; test_a_taken_port_is_reported_with_its_flag is the default path
@pytest.mark.slow
def test_a_port_taken_after_the_check_fails_fast_instead_of_hanging(tiny_qwen2, tmp_path, monkeypatch):
    # SGLang itself hangs forever when uvicorn cannot bind; simulate losing the race for the port.
    port = find_free_port()
    monkeypatch.setattr(engines_module, "require_free_port", lambda *args: None)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        group = EngineGroup(one_engine(tiny_qwen2, "--sglang-base-port", str(port)), tmp_path / "run")
        start = time.monotonic()
        with pytest.raises(EngineStartError, match="engine-0: cannot bind its port"):
            group.start()
    assert time.monotonic() - start < 200  # well before --engine-start-timeout (300 s)
    assert all(pids == [] for pids in group.pids().values()), group.pids()


START_AND_WAIT = textwrap.dedent("""
    import json, sys, time
    from lean_rl.backends.sglang.engines import EngineGroup
    from lean_rl.testing.sglang_engines import engine_config_for_tests
    config = engine_config_for_tests(sys.argv[1], "--rollout-num-engines", "1")
    group = EngineGroup(config, sys.argv[2]).start()
    print("PIDS " + json.dumps(group.pids()), flush=True)
    time.sleep(600)
""")


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline() if ready else ""


# slow (suite time): the trainer's side by default in test_megatron_group.py::test_actors_die_with_their_driver
@pytest.mark.slow
def test_no_orphans_when_the_driver_is_killed(tiny_qwen2, tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", START_AND_WAIT, str(tiny_qwen2), str(tmp_path / "run")],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = read_line(driver, timeout_s=300)  # the group is up (or the driver died / timed out)
        assert line.startswith("PIDS "), f"driver printed {line!r}; logs in {tmp_path / 'run'}"
        pids_by_name = json.loads(line[5:])
        pids = [pid for tree in pids_by_name.values() for pid in tree]
        assert len(pids_by_name["engine-0"]) >= 3, pids_by_name  # server, scheduler, detokenizer (+ tracker)
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    assert_all_gone(pids)
