"""The run's key stays home (backends/sglang/run_key.py, config.resolve_api_key): $LEAN_RL_API_KEY is
read once and leaves the environment, so a child started afterwards (as the router, Ray and SGLang
are) does not have it in /proc/PID/environ; a pickled config or weight-sync plan (a Ray actor's
argument) holds the path of the key's 0600 file, not the key; a key file its group or others may
read is refused in one line."""

import os
import pickle
import stat
import subprocess
import sys

import pytest
from ray import cloudpickle

from lean_rl.backends.sglang.config import EngineConfig
from lean_rl.backends.sglang.ports_and_key import resolve_api_key, resolve_ports
from lean_rl.backends.sglang.api_keys import API_KEY_ENV, CHILD_API_KEY_ENV, NO_API_KEY
from lean_rl.backends.sglang.run_key import FileBackedKey
from lean_rl.options import ConfigError, build
from lean_rl.weight_sync.rank import RankSyncPlan
from lean_rl.weight_sync.transports.disk import DiskTransport

KEY = "run-key-test-0123456789abcdef"


def config(**fields) -> EngineConfig:
    return resolve_ports(build(EngineConfig, model_path="/m", num_engines=1, device="cpu", **fields))


def environ_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


SLEEPER = "import time; print('ready', flush=True); time.sleep(30)"


def started(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A child once it runs its own program: before its exec, /proc/PID/environ is still its parent's."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_the_variable_is_read_once_and_no_child_started_afterwards_has_it(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    engines = resolve_api_key(config())
    assert engines.api_key == KEY and API_KEY_ENV not in os.environ
    # a child as the driver starts the router, Ray and the rest: from this process's environment
    child = started([sys.executable, "-c", SLEEPER], env=dict(os.environ))
    router = started([sys.executable, "-c", SLEEPER], env={**os.environ, **engines.router_env()})
    try:
        assert KEY.encode() not in environ_of(child.pid)
        # the router serves: it gets the key, under its own name only, never $LEAN_RL_API_KEY
        router_env = environ_of(router.pid).split(b"\0")
        assert f"{CHILD_API_KEY_ENV}={KEY}".encode() in router_env
        assert not [entry for entry in router_env if entry.startswith(f"{API_KEY_ENV}=".encode())]
    finally:
        for proc in (child, router):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("source", ["variable", "flag", "random"])
def test_a_pickled_config_holds_the_path_of_a_private_key_file_not_the_key(source, tmp_path):
    environ = {API_KEY_ENV: KEY} if source == "variable" else {}
    engines = resolve_api_key(config(api_key=KEY) if source == "flag" else config(), environ=environ)
    key = engines.api_key
    assert isinstance(key, FileBackedKey) and (source == "random" or key == KEY)
    for dumps in (pickle.dumps, cloudpickle.dumps):  # what Ray uses for an actor's arguments
        data = dumps(engines)
        assert key.encode() not in data and key.path.encode() in data
        assert pickle.loads(data).api_key == key  # read back from the file, in the receiving process
    assert stat.S_IMODE(os.stat(key.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(key.path)).st_mode) == 0o700
    plan = RankSyncPlan(transport=DiskTransport, engine_urls=("http://127.0.0.1:1",), engine_tp_sizes=(1,),
                        buffer_size_bytes=1, timeout_s=1.0, family="qwen2", group_prefix="g", backend="gloo",
                        api_key=key)
    data = cloudpickle.dumps(plan)
    assert key.encode() not in data and pickle.loads(data).api_key == key


def test_a_config_with_a_key_but_no_key_file_does_not_pickle():
    with pytest.raises(ConfigError, match="travels only as the path of its file"):
        pickle.dumps(config(api_key=KEY))
    assert pickle.loads(pickle.dumps(resolve_api_key(config(api_key=NO_API_KEY)))).api_key == NO_API_KEY


def test_the_users_key_file_is_what_travels(tmp_path):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    engines = resolve_api_key(config(api_key_file=str(path)), environ={})
    assert engines.api_key == KEY and engines.api_key.path == str(path)
    path.chmod(0o644)  # loosened while the run goes on: a receiving process refuses it too
    with pytest.raises(ConfigError, match=r"permissions 0644 for '.*' are too open"):
        pickle.loads(pickle.dumps(engines))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_open_to_group_or_others_is_refused_in_one_line(tmp_path, mode):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(mode)
    with pytest.raises(ConfigError) as refused:
        resolve_api_key(config(api_key_file=str(path)), environ={})
    message = str(refused.value)
    assert f"--sglang-api-key-file {path}: permissions {mode:04o} for '{path}' are too open" in message
    assert "\n" not in message and KEY not in message
    path.chmod(0o400)  # read-only for its owner: fine
    assert resolve_api_key(config(api_key_file=str(path)), environ={}).api_key == KEY
