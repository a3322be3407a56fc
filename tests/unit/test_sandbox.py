"""lean_rl/rollout/sandbox.py: each limit is enforced by a real child interpreter (no mocks)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from lean_rl.rollout.sandbox import STATUSES, SandboxLimits, SandboxResult, run_python


def run(code: str, stdin: str = "", **limits) -> SandboxResult:
    result = asyncio.run(run_python(code, SandboxLimits(**limits), stdin=stdin))
    assert result.status in STATUSES
    return result


def gone(pid: int, deadline_s: float = 5.0) -> bool:
    """True once `pid` no longer runs (absent, or a zombie awaiting a reaper)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def user_netns_available() -> bool:
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x50000000) != 0)"
    return subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0


# A raw fork through libc: the audit hook cannot see it, the process-group kill must still get the grandchild.
RAW_FORK = "import ctypes, os, time\npid = ctypes.CDLL(None).fork()\n"


def test_ok_output_stdin_and_empty_code():
    result = run("print(input()[::-1])", stdin="olleh\n")
    assert (result.status, result.stdout, result.exit_code, result.truncated) == ("ok", "hello\n", 0, False)
    assert run("").status == "ok" and run("").as_observation() == "(no output)"


def test_child_environment_and_cwd_are_fresh_and_removed(monkeypatch):
    monkeypatch.setenv("LEAN_RL_TEST_SECRET", "x")
    result = run("import os; print(os.getcwd()); print(sorted(os.environ))")
    cwd, env = result.stdout.splitlines()
    assert "LEAN_RL_TEST_SECRET" not in env and "lean_rl_sandbox_" in cwd
    assert not os.path.exists(cwd)


def test_wall_timeout_busy_loop_and_sleep():
    for code in ("while True: pass", "import time; time.sleep(100)"):
        result = run(code, wall_timeout_s=1.0, cpu_seconds=30)
        assert result.status == "timeout" and result.seconds < 4, (code, result)
        assert "timeout" in result.as_observation()


def test_timeout_kills_a_forked_grandchild():
    result = run(RAW_FORK + "if pid: print(pid, flush=True)\ntime.sleep(100)", wall_timeout_s=1.0)
    assert result.status == "timeout"
    assert gone(int(result.stdout.split()[0]))


def test_grandchild_left_behind_does_not_hold_the_call():
    # The child exits at once; its grandchild still holds the output pipes: the call must not wait for it.
    result = run(RAW_FORK + "if pid: print(pid)\nelse: time.sleep(100)", wall_timeout_s=20.0)
    assert result.status == "ok" and result.seconds < 10
    assert gone(int(result.stdout.split()[0]))


def descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_cancelled_call_kills_the_group():
    async def start_then_cancel() -> set[int]:
        before = descendants(os.getpid())  # earlier tests' workers (a reward pool, ...) are not the sandbox's
        task = asyncio.create_task(run_python(RAW_FORK + "time.sleep(100)", SandboxLimits(wall_timeout_s=60.0)))
        end = time.monotonic() + 20
        while len(spawned := descendants(os.getpid()) - before) < 2 and time.monotonic() < end:
            await asyncio.sleep(0.1)  # the child and its grandchild
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return spawned
    spawned = asyncio.run(start_then_cancel())
    assert len(spawned) == 2 and all(gone(pid) for pid in spawned)


def test_cpu_limit():
    result = run("while True: pass", cpu_seconds=1, wall_timeout_s=20.0)
    assert result.status == "cpu_limit" and "CPU time" in result.as_observation()


def test_memory_limit():
    result = run("x = bytearray(2 * 1024**3)", memory_mb=256)
    assert result.status == "memory_limit" and "MemoryError" in result.stderr


def test_file_size_limit():
    result = run("open('big', 'wb').write(b'x' * 2_000_000)", max_file_bytes=1_000_000)
    assert result.status == "error" and "File too large" in result.stderr


def test_output_cap_bounds_the_parent():
    tracemalloc.start()
    try:
        result = run("import sys; sys.stdout.write('x' * 50_000_000)", wall_timeout_s=30.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.status == "output_limit" and result.truncated and result.seconds < 10
    assert len(result.stdout.encode()) + len(result.stderr.encode()) <= SandboxLimits().max_output_bytes
    assert peak < 5_000_000, f"the parent held {peak} bytes"


def test_endless_printing_is_stopped_by_the_cap_not_the_clock():
    result = run("while True: print('spam')", max_output_bytes=1000, wall_timeout_s=30.0)
    assert result.status == "output_limit" and len(result.stdout) == 1000 and result.seconds < 10


def test_tcp_connection_to_loopback_fails():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run(f"import socket; socket.socket().connect(('127.0.0.1', {port}))")
        assert result.status == "error"
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert run("import socket; socket.getaddrinfo('localhost', 80)").status == "error"


def test_unix_socket_connect_refused_by_audit_hook(tmp_path):
    # A filesystem unix socket is reachable from any network namespace: only the audit hook stops it.
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        result = run(f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})")
        assert result.status == "error" and "socket.connect is not allowed" in result.stderr
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.skipif(not user_netns_available(), reason="unshare(CLONE_NEWUSER|CLONE_NEWNET) refused here")
def test_network_namespace_has_only_loopback():
    host = [name for _, name in socket.if_nameindex()]
    if host == ["lo"]:
        pytest.skip("this host has no interface but loopback: a namespace would look the same")
    code = "import socket; print([name for _, name in socket.if_nameindex()])"
    assert run(code).stdout == "['lo']\n"
    assert run(code, network=True).stdout == f"{host}\n"


def test_files_outside_the_working_directory_are_refused(tmp_path):
    outside = Path("/tmp") / f"lean_rl_sandbox_test_{uuid.uuid4().hex}"
    result = run(f"open({str(outside)!r}, 'w').write('x')")
    assert result.status == "error" and "PermissionError" in result.stderr and not outside.exists()
    assert run("print(open('/etc/passwd').read())").status == "error"
    victim = tmp_path / "keep"
    victim.write_text("x")
    assert run(f"import os; os.remove({str(victim)!r})").status == "error" and victim.exists()
    inside = run("open('out.txt', 'w').write('hi'); print(open('out.txt').read())")
    assert (inside.status, inside.stdout) == ("ok", "hi\n")
    assert run("import numpy; print(numpy.arange(4).sum())").stdout == "6\n"  # site-packages stay readable


def test_processes_cannot_be_started():
    for code in ("import subprocess; subprocess.run(['true'])", "import os; os.system('true')",
                 "import os; os.fork()"):
        result = run(code)
        assert result.status == "error" and "is not allowed" in result.stderr, code


def test_syntax_error_and_crashes():
    result = run("x = (")
    assert result.status == "error" and "SyntaxError" in result.stderr
    for code, name in (("import os; os.abort()", "SIGABRT"), ("import ctypes; ctypes.string_at(0)", "SIGSEGV")):
        result = run(code)
        assert result.status == "error" and name in result.as_observation(), code


def test_observation_is_compact():
    result = run("print('a' * 10_000); raise ValueError('the end')")
    text = result.as_observation(limit_chars=500)
    assert len(text) <= 500 and "characters cut" in text
    assert text.rstrip().endswith("[exit code 1]") and "ValueError: the end" in text
