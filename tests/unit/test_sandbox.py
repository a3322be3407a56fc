"""lean_rl/rollout/sandbox.py: each limit is enforced by a real child interpreter in a real bubblewrap
sandbox (the default backend; no mocks). What the boundary keeps out is tested from outside, escape by
escape, in tests/integration/test_sandbox_escapes.py."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import tracemalloc
from pathlib import Path

import pytest

from lean_rl.rollout import cgroups, sandbox
from lean_rl.rollout.bwrap import BoundaryUnavailable, exit_code
from lean_rl.rollout.cgroups import CgroupUnavailable
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


def _cgroup_or_why() -> tuple[cgroups.Hierarchy | None, str]:
    try:
        return asyncio.run(cgroups.probe()), ""
    except CgroupUnavailable as err:
        return None, str(err)


CGROUP, NO_CGROUP_BECAUSE = _cgroup_or_why()
NEEDS_CGROUP = pytest.mark.skipif(CGROUP is None, reason=f"no cgroup pids/memory limit here: {NO_CGROUP_BECAUSE}")


def calls_cgroups_left() -> list[str]:
    """This process's calls' cgroups that still exist (each call deletes its own)."""
    if CGROUP is None:
        return []
    return [name for c in cgroups.CONTROLLERS for name in os.listdir(CGROUP.dirs[c])
            if name.startswith(f"lean_rl-{os.getpid()}-")]


@pytest.fixture
def no_sandbox():
    sandbox.use_backend("none")
    yield
    sandbox.use_backend("bwrap")


# A raw fork through libc: the audit hook cannot see it, the process-group kill must still get the grandchild.
RAW_FORK = "import ctypes, os, time\npid = ctypes.CDLL(None).fork()\n"


def test_ok_output_stdin_and_empty_code():
    result = run("print(input()[::-1])", stdin="olleh\n")
    assert (result.status, result.stdout, result.exit_code, result.truncated) == ("ok", "hello\n", 0, False)
    assert run("").status == "ok" and run("").as_observation() == "(no output)"


def test_child_environment_and_cwd_are_fresh(monkeypatch):
    monkeypatch.setenv("LEAN_RL_TEST_SECRET", "x")
    result = run("import os; open('f', 'w').write('x'); print(os.getcwd()); print(sorted(os.environ))")
    cwd, env = result.stdout.splitlines()
    assert "LEAN_RL_TEST_SECRET" not in env and cwd == "/sandbox"  # a tmpfs of the sandbox's own


def test_wall_timeout_busy_loop_and_sleep():
    for code in ("while True: pass", "import time; time.sleep(100)"):
        result = run(code, wall_timeout_s=1.0, cpu_seconds=30)
        assert result.status == "timeout" and result.seconds < 4, (code, result)
        assert "timeout" in result.as_observation()


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


def spawned_by(code: str, limits: SandboxLimits, at_least: int, cancel: bool) -> tuple[set[int], object]:
    """Run `code`; once at least `at_least` new processes descend from this one (bwrap, the namespace's
    init, the interpreter, what it forked), cancel the call (or let it end). Returns them and the result."""
    async def main():
        before = descendants(os.getpid())  # earlier tests' workers (a reward pool, ...) are not the sandbox's
        task = asyncio.create_task(run_python(code, limits))
        end = time.monotonic() + 20
        seen: set[int] = set()
        while len(seen) < at_least and time.monotonic() < end and not task.done():
            seen |= descendants(os.getpid()) - before
            await asyncio.sleep(0.05)
        if cancel:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return seen, None
        return seen, await task
    return asyncio.run(main())


def test_timeout_kills_a_forked_grandchild():
    spawned, result = spawned_by(RAW_FORK + "time.sleep(100)", SandboxLimits(wall_timeout_s=2.0), 4, cancel=False)
    assert result.status == "timeout"
    assert len(spawned) >= 4 and all(gone(pid) for pid in spawned)
    assert calls_cgroups_left() == []


def test_grandchild_left_behind_does_not_hold_the_call():
    # The child exits at once; its grandchild would still hold the output pipes: the namespace dies with it.
    result = run(RAW_FORK + "if pid: print(pid)\nelse: time.sleep(100)", wall_timeout_s=20.0)
    assert result.status == "ok" and result.seconds < 10


def test_cancelled_call_kills_the_namespace():
    spawned, _ = spawned_by(RAW_FORK + "time.sleep(100)", SandboxLimits(wall_timeout_s=60.0), 4, cancel=True)
    assert len(spawned) >= 4 and all(gone(pid) for pid in spawned)
    assert calls_cgroups_left() == []  # deleted also when the call is cancelled


def test_cpu_limit():
    result = run("while True: pass", cpu_seconds=1, wall_timeout_s=20.0)
    assert result.status == "cpu_limit" and "CPU time" in result.as_observation()


def test_memory_limit():
    result = run("x = bytearray(2 * 1024**3)", memory_mb=256)
    assert result.status == "memory_limit" and "MemoryError" in result.stderr


# one process within its own RLIMIT_AS (memory_mb) but past the whole call's cgroup memory (call_memory_mb)
OVER_CALL_MEMORY = dict(code="x = b'x' * (200 << 20); print('survived')", memory_mb=512, call_memory_mb=100)


@NEEDS_CGROUP
def test_call_memory_is_bounded_by_its_cgroup_and_the_start_up_line_says_so():
    code, limits = OVER_CALL_MEMORY["code"], {k: v for k, v in OVER_CALL_MEMORY.items() if k != "code"}
    result = run(code, **limits)
    assert result.status == "memory_limit" and "survived" not in result.stdout, result
    assert result.exit_code == -9 and "memory limit exceeded" in result.as_observation()  # the OOM killer's SIGKILL
    assert run("x = b'x' * (50 << 20); print('fine')", **limits).status == "ok"
    line = sandbox.limits_in_force()
    assert f"cgroup pids/memory limit IN FORCE (cgroup v{CGROUP.version}" in line, line
    assert calls_cgroups_left() == []


def test_without_cgroup_tools_calls_run_unbounded_and_say_so(monkeypatch, tmp_path, caplog):
    """The cgroup alone fails open: the call still runs in the namespace boundary, and it is not silent."""
    sandbox.check_boundary()  # bwrap proven with the real PATH (as at start-up)
    monkeypatch.setattr(sandbox, "_cgroup", None)  # as in a fresh process
    monkeypatch.setattr(sandbox, "_no_cgroup_because", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cgroup-tools there
    code, limits = OVER_CALL_MEMORY["code"], {k: v for k, v in OVER_CALL_MEMORY.items() if k != "code"}
    with caplog.at_level(logging.WARNING, logger="lean_rl.rollout.sandbox"):
        result = run(code, **limits)
    assert result.status == "ok" and "survived" in result.stdout, result
    assert any("NO cgroup pids/memory limit" in r.getMessage() and "cgroup-tools is not installed" in r.getMessage()
               and "apt-get install cgroup-tools" in r.getMessage() for r in caplog.records)
    line = sandbox.limits_in_force()
    assert "NO cgroup pids/memory limit (cgroup-tools is not installed" in line and "fail-open" in line, line
    assert "NPROC = max_processes" in line, line  # as root too: bwrap runs as an unprivileged uid


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


def test_working_directory_is_bounded():
    code = "for i in range(100): open(f'f{i}', 'wb').write(b'x' * 500_000)"
    result = run(code, tmpfs_mb=4, max_file_bytes=1_000_000)
    assert result.status == "error" and "No space left on device" in result.stderr
    assert run("import numpy; print(numpy.arange(4).sum())").stdout == "6\n"  # site-packages are there


def test_audit_hook_gives_a_friendly_error_first(tmp_path):
    # Not the boundary (tests/integration/test_sandbox_escapes.py is): a clear message for a plain mistake.
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        result = run(f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})")
    assert result.status == "error" and "socket.connect is not allowed" in result.stderr
    result = run("print(open('/etc/hostname').read())")
    assert result.status == "error" and "reading '/etc/hostname' is not allowed" in result.stderr


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


def test_bwrap_exit_status_of_a_killed_child():
    assert (exit_code(0), exit_code(3), exit_code(128 + 11), exit_code(-9)) == (0, 3, -11, -9)


def test_without_bwrap_no_call_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_proven_bwrap", None)  # as in a fresh process
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap there
    marker = tmp_path / "ran"
    with pytest.raises(BoundaryUnavailable, match="apt-get install bubblewrap.*--tool-sandbox none"):
        asyncio.run(run_python(f"open({str(marker)!r}, 'w')"))
    assert not marker.exists()


def test_none_runs_on_the_host_and_warns_on_every_call(no_sandbox, caplog):
    with caplog.at_level(logging.WARNING, logger="lean_rl.rollout.sandbox"):
        cwds = [run("import os; print(os.getcwd())").stdout for _ in range(2)]
    assert all("lean_rl_sandbox_" in cwd and not os.path.exists(cwd.strip()) for cwd in cwds)
    assert sum("--tool-sandbox none" in r.getMessage() for r in caplog.records) == 2
    # the process group is still killed at the wall clock
    result = run(RAW_FORK + "if pid: print(pid, flush=True)\ntime.sleep(100)", wall_timeout_s=1.0)
    assert result.status == "timeout" and gone(int(result.stdout.split()[0]))


def test_a_runtime_under_the_hosts_tmp_keeps_its_bind_and_tmp_is_no_symlink(monkeypatch):
    """A venv under /tmp (a checkout there): binding it creates /tmp in the sandbox, so /tmp cannot also
    be the symlink to the working directory (bwrap: "Can't make symlink at /tmp: File exists")."""
    from lean_rl.rollout import bwrap

    monkeypatch.setattr(bwrap, "runtime_dirs", lambda: ["/tmp/checkout/.venv"])
    monkeypatch.setattr(bwrap, "_reachable_by_others", lambda path: True)
    argv = bwrap.bwrap_argv("bwrap", 3, 4, 1 << 20, {})
    assert "/tmp/checkout/.venv" in argv
    assert not any(argv[i:i + 3] == ["--symlink", bwrap.WORKDIR, "/tmp"] for i in range(len(argv)))
    monkeypatch.setattr(bwrap, "runtime_dirs", lambda: ["/opt/venv"])
    argv = bwrap.bwrap_argv("bwrap", 3, 4, 1 << 20, {})
    assert any(argv[i:i + 3] == ["--symlink", bwrap.WORKDIR, "/tmp"] for i in range(len(argv)))


@pytest.mark.skipif(os.geteuid() != 0, reason="bwrap switches to its own uid only when lean_rl runs as root")
def test_as_root_without_setpriv_no_call_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_proven_bwrap", None)  # a fresh process: the start-up probe
    monkeypatch.setattr(os, "defpath", str(tmp_path))  # where calls' commands are looked up: no util-linux there
    with pytest.raises(BoundaryUnavailable, match="no setpriv.*apt-get install util-linux"):
        sandbox.check_boundary()
