"""Tool code tries to get out of the sandbox (lean_rl/rollout/sandbox.py, bubblewrap: lean_rl/rollout/bwrap.py)
as an attacker would; each attempt is judged from OUTSIDE by its effect on the host: a listener that was
never connected to, a secret that never reached the output, a file that does not exist afterwards, a
host process still alive. Most snippets go through ctypes or other paths that the audit hook does not
see, so what stops them is the boundary itself (namespaces, mounts, rlimits), not the friendly hook."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from lean_rl.rollout import cgroups, sandbox
from lean_rl.rollout.cgroups import CgroupUnavailable
from lean_rl.rollout.sandbox import SandboxLimits, SandboxResult, run_python

# ctypes' libc, an errno reporter, and struct: what each snippet below starts with
PRELUDE = """import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def err(): return os.strerror(ctypes.get_errno())
"""


def run(code: str, **limits) -> SandboxResult:
    return asyncio.run(run_python(PRELUDE + code, SandboxLimits(**limits)))


@pytest.fixture
def host_process():
    """A host process (its environment holds a secret) that tool code must neither read nor kill."""
    secret = uuid.uuid4().hex
    proc = subprocess.Popen(["sleep", "120"], env={"LEAN_RL_SECRET": secret})
    yield proc, secret
    proc.kill()
    proc.wait()


@pytest.fixture
def secret_files(tmp_path):
    """A secret in the host's /tmp and one in $HOME: neither directory exists in the sandbox."""
    secret = uuid.uuid4().hex
    files = [tmp_path / "secret.txt", Path.home() / f".lean_rl_test_secret_{uuid.uuid4().hex}"]
    for path in files:
        path.write_text(secret)
    yield files, secret
    files[1].unlink()


def never_connected(listener: socket.socket) -> bool:
    listener.setblocking(False)
    try:
        listener.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def test_tcp_to_a_host_loopback_listener():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        plain = run(f"import socket; socket.socket().connect(('127.0.0.1', {port}))")
        # through libc: socket(AF_INET, SOCK_STREAM) and connect() with a raw sockaddr_in
        raw = run(f"""fd = libc.socket(2, 1, 0)
addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)
print('connect', libc.connect(fd, addr, 16), err())""")
        assert plain.status == "error" and never_connected(listener)
    assert "connect -1" in raw.stdout, raw  # the namespace's own loopback: nobody listens there


def unix_connect(path: bytes) -> str:
    return f"""fd = libc.socket(1, 1, 0)
addr = struct.pack('=H', 1) + {path!r}
print('connect', libc.connect(fd, addr, len(addr)), err())"""


def test_filesystem_unix_socket_through_ctypes(tmp_path):
    path = str(tmp_path / "host.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        result = run(unix_connect(path.encode() + b"\0"))
        assert never_connected(listener)
    assert "connect -1 No such file or directory" in result.stdout, result  # the host's /tmp is not there


def test_abstract_unix_socket():
    name = b"\0lean_rl_test_" + uuid.uuid4().hex.encode()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(name)
        listener.listen()
        result = run(unix_connect(name))
        assert never_connected(listener)
    assert "connect -1 Connection refused" in result.stdout, result  # abstract names are per network namespace


@pytest.mark.parametrize("how", ["open", "dir_fd", "ctypes"])
def test_reading_a_file_outside(secret_files, how):
    files, secret = secret_files
    for path in files:
        code = {
            "open": f"print(open({str(path)!r}).read())",
            # os.open of a relative name passes the audit hook's path check; the directory fd comes from libc
            "dir_fd": f"d = libc.open({str(path.parent).encode()!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
                      f"print('dir', d, err()); print(os.read(os.open({path.name!r}, os.O_RDONLY, dir_fd=d), 100))",
            "ctypes": f"fd = libc.open({str(path).encode()!r}, os.O_RDONLY)\nprint('fd', fd, err())\n"
                      "print(os.read(fd, 100))",
        }[how]
        result = run(code)
        assert result.status == "error", result
        assert secret not in result.stdout + result.stderr, (path, result)


def test_reading_another_process_environment(host_process):
    proc, secret = host_process
    result = run(f"""fd = libc.open(b'/proc/{proc.pid}/environ', os.O_RDONLY)
print('fd', fd, err()); print(os.read(fd, 4096))""")
    assert result.status == "error" and "fd -1" in result.stdout, result  # not in this PID namespace
    assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize("how", ["open", "ctypes"])
def test_writing_outside(tmp_path, how):
    # the host's /tmp (absent in the sandbox) and the venv (bound read-only)
    targets = [tmp_path / "escaped", Path(sys.prefix) / f"lean_rl_escaped_{uuid.uuid4().hex}"]
    try:
        for target in targets:
            code = {"open": f"open({str(target)!r}, 'w').write('x')",
                    "ctypes": f"fd = libc.open({str(target).encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)\n"
                              "print('fd', fd, err()); os.write(fd, b'x')"}[how]
            result = run(code)
            assert result.status == "error" and not target.exists(), (target, result)
    finally:
        targets[1].unlink(missing_ok=True)


def test_kill_and_pidfd_send_signal_of_a_host_process(host_process):
    proc, _ = host_process
    result = run(f"""print('kill', libc.kill({proc.pid}, 9), err())
pidfd = libc.syscall(434, {proc.pid}, 0)  # pidfd_open
print('pidfd_open', pidfd, err())
print('pidfd_send_signal', libc.syscall(424, pidfd, 9, None, 0), err())""")
    time.sleep(0.5)
    assert proc.poll() is None, result  # still alive
    assert "kill -1 No such process" in result.stdout, result


def host_processes_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_double_forked_setsid_grandchild_does_not_outlive_the_call(tmp_path):
    late, marker = tmp_path / "late", f"lean_rl_marker_{uuid.uuid4().hex}"
    # the grandchild execs an interpreter that carries `marker` in its argv: visible in the host's /proc
    grandchild = f"import time; time.sleep(3); open({str(late)!r}, 'w').write('late')"
    result = run(f"""if libc.fork() == 0:
    libc.setsid()
    if libc.fork() == 0:
        argv = (ctypes.c_char_p * 5)(sys.executable.encode(), b'-c', {grandchild.encode()!r}, {marker.encode()!r}, None)
        libc.execv(sys.executable.encode(), argv)
    os._exit(0)
time.sleep(1)
print('parent done')""", wall_timeout_s=10.0)
    assert result.status == "ok" and "parent done" in result.stdout, result
    assert host_processes_with(marker) == []
    time.sleep(4)
    assert not late.exists()


def test_multiprocessing_spawn_writing_outside(tmp_path):
    target = tmp_path / "escaped"
    result = run(f"""import multiprocessing, pathlib
p = multiprocessing.get_context('spawn').Process(target=pathlib.Path({str(target)!r}).write_text, args=('x',))
p.start(); p.join(); print('exitcode', p.exitcode)""", wall_timeout_s=20.0)
    assert "exitcode 1" in result.stdout, result  # it started, and its write failed
    assert not target.exists()


def test_posixsubprocess_fork_exec_writing_outside(tmp_path):
    target = tmp_path / "escaped"
    writer = f"open({str(target)!r}, 'w').write('x')"
    result = run(f"""import _posixsubprocess
r, w = os.pipe()
pid = _posixsubprocess.fork_exec([sys.executable, '-c', {writer!r}], [sys.executable.encode()], True, (w,), None,
                                 None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None,
                                 False)
print('exit', os.waitpid(pid, 0)[1] >> 8)""", wall_timeout_s=20.0)
    assert "exit 1" in result.stdout, result  # it ran, and its write failed
    assert not target.exists()


TRUE = shutil.which("true") or "true"  # found once: a test may empty PATH (no cgroup-tools) while it watches


class HostWatch:
    """While a call runs, seen from outside: how late a 50 ms sleep of the host wakes up and how long the
    host takes to fork/exec `true` (responsiveness); the most processes and memory (proportional set size)
    the call's processes (this process's new descendants) hold at once; the host's whole process count;
    and the cgroups the call's processes were in, with the limits read from those cgroups then."""

    def __init__(self):
        self.before = descendants(os.getpid())
        self.host_baseline = host_process_count()
        self.max_lag_s = self.max_true_s = 0.0
        self.max_processes, self.max_pss_mb, self.max_host_processes = 0, 0.0, self.host_baseline
        self.seen: set[int] = set()
        self.cgroups: dict[str, dict[str, str]] = {}  # "controller:path" -> its limit files read during the call
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.done.is_set():
            start = time.monotonic()
            time.sleep(0.05)
            self.max_lag_s = max(self.max_lag_s, time.monotonic() - start - 0.05)
            start = time.monotonic()
            subprocess.run([TRUE], check=True, timeout=30)
            self.max_true_s = max(self.max_true_s, time.monotonic() - start)
            pids = descendants(os.getpid()) - self.before
            self.seen |= pids
            self.max_processes = max(self.max_processes, len(pids))
            self.max_pss_mb = max(self.max_pss_mb, sum(pss_mb(pid) for pid in pids))
            self.max_host_processes = max(self.max_host_processes, host_process_count())
            for pid in pids:
                for group in cgroups_of(pid):
                    if group not in self.cgroups:
                        self.cgroups[group] = limits_of(group)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def host_process_count() -> int:
    return sum(1 for _ in Path("/proc").glob("[0-9]*"))


def cgroups_of(pid: int) -> set[str]:
    """"controller:path" of the pids and memory cgroups `pid` is in (v2: both controllers, one path)."""
    found = set()
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if CGROUP is None or CGROUP.version != (1 if controllers else 2):
            continue
        for controller in controllers.split(",") if controllers else cgroups.CONTROLLERS:
            # children of lean_rl's own cgroup, where calls' cgroups are made (not that cgroup itself: cgexec
            # starts there before it moves itself; nor the root a reaped process reads as)
            parent = CGROUP.parents.get(controller)
            if parent is not None and os.path.dirname(path) == parent and path != parent:
                found.add(f"{controller}:{path}")
    return found


def cgroup_dir(group: str) -> Path:
    """A call's cgroup (a child of this process's own, where lean_rl makes them) as a directory."""
    controller, path = group.split(":", 1)
    return Path(CGROUP.dirs[controller]) / os.path.basename(path)


def limits_of(group: str) -> dict[str, str]:
    names = {"pids": ("pids.max",), "memory": ("memory.limit_in_bytes", "memory.max")}[group.split(":")[0]]
    found = {}
    for name in names:
        try:
            found[name] = (cgroup_dir(group) / name).read_text().strip()
        except OSError:
            continue
    return found


def descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def pss_mb(pid: int) -> float:
    """Proportional set size: pages a forked child shares with its parent count once, not per process."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0.0


def _cgroup_or_why() -> tuple[cgroups.Hierarchy | None, str]:
    """The cgroup every call gets here (what sandbox.check_cgroups proves the same way), or why none."""
    try:
        return asyncio.run(cgroups.probe()), ""
    except CgroupUnavailable as err:
        return None, str(err)


CGROUP, NO_CGROUP_BECAUSE = _cgroup_or_why()
# What bounds a call's processes: the cgroup's pids.max where a cgroup is in force, and RLIMIT_NPROC in the
# call's user namespace, always: the kernel exempts root's processes from it (kernel/fork.c), so when lean_rl
# runs as root bwrap runs as bwrap.SANDBOX_HOST_UID (tests/integration/test_sandbox_kernel_escapes.py).


def assert_in_a_cgroup_now_gone(watch: HostWatch, limits: dict) -> None:
    """With a cgroup in force: the call's processes were in one cgroup per controller, made for the call
    with the call's limits (read from the cgroup during the call), and both are gone now."""
    if CGROUP is None:
        return
    assert sorted(group.split(":")[0] for group in watch.cgroups) == sorted(cgroups.CONTROLLERS), watch.cgroups
    for group, found in watch.cgroups.items():
        assert os.path.basename(group).startswith("lean_rl-"), group
        expected = {"pids": str(limits["max_processes"] + 1),
                    "memory": str(limits.get("call_memory_mb", SandboxLimits.call_memory_mb) << 20)}
        assert list(found.values()) == [expected[group.split(":")[0]]], (group, found)
        assert not cgroup_dir(group).exists(), group


def assert_host_responsive(watch: HostWatch) -> None:
    assert watch.max_lag_s < 1.0 and watch.max_true_s < 1.0, (watch.max_lag_s, watch.max_true_s)
    # other sessions share this machine: a margin for their processes; an unbounded fork bomb makes thousands
    assert watch.max_host_processes - watch.host_baseline < 100, (watch.host_baseline, watch.max_host_processes)
    assert host_process_count() - watch.host_baseline < 100, (watch.host_baseline, host_process_count())


@pytest.mark.parametrize("bound", ["as in force here", "RLIMIT_NPROC alone"])
def test_fork_bomb_is_bounded(bound, monkeypatch, tmp_path):
    limits = dict(max_processes=8, wall_timeout_s=4.0, cpu_seconds=10)
    if bound == "RLIMIT_NPROC alone":  # no cgroup-tools on PATH (the start-up probe then finds no cgroup)
        sandbox.check_boundary()
        monkeypatch.setattr(sandbox, "_cgroup", None)
        monkeypatch.setattr(sandbox, "_no_cgroup_because", None)
        monkeypatch.setenv("PATH", str(tmp_path))
    with HostWatch() as watch:
        result = run("while True: libc.fork()", **limits)
    # forks past the bound fail (EAGAIN) and the bomb spins on until the wall clock ends the call
    assert result.status == "timeout" and result.seconds < 10, result
    # pids.max (cgroup) counts bwrap itself too; RLIMIT_NPROC counts the namespace's init, the interpreter, its forks
    assert 2 < watch.max_processes <= 1 + limits["max_processes"], watch.max_processes
    assert all(gone(pid) for pid in watch.seen)  # the whole PID namespace died with the call
    assert_host_responsive(watch)
    if bound == "RLIMIT_NPROC alone":
        assert watch.cgroups == {}, watch.cgroups
    else:
        assert_in_a_cgroup_now_gone(watch, limits)


HOG = """held = []
while True:
    pid = libc.fork()
    if pid == 0:
        try:
            held.append(b'x' * (100 << 20))  # touched: resident, not only reserved
            held.append(b'x' * (100 << 20))  # past RLIMIT_AS
        except MemoryError:
            pass
        time.sleep(60)
    if pid < 0:
        time.sleep(0.1)"""


def test_memory_hog_over_many_processes_is_bounded():
    # up to 6 x 100 MB held; with a cgroup the call's 300 MB are reached first, without one 6 x 160 MB
    limits = dict(max_processes=6, memory_mb=160, call_memory_mb=300, wall_timeout_s=5.0, cpu_seconds=10)
    with HostWatch() as watch:
        result = run(HOG, **limits)
    assert watch.max_processes <= 1 + limits["max_processes"], watch.max_processes
    assert watch.max_pss_mb >= 150, watch.max_pss_mb  # the hogs did get their first 100 MB each
    if CGROUP is not None:
        # the OOM killer kept the call inside its cgroup's memory; the call says so
        assert result.status == "memory_limit" and "memory limit exceeded" in result.as_observation(), result
        # 30 MB: file pages (the interpreter, libraries) that another process brought into memory count
        # in each mapping process's PSS but not in this cgroup
        assert watch.max_pss_mb <= limits["call_memory_mb"] + 30, watch.max_pss_mb
    else:  # RLIMIT_AS per process x RLIMIT_NPROC (not root)
        assert result.status == "timeout", result
        assert watch.max_pss_mb <= limits["max_processes"] * limits["memory_mb"], watch.max_pss_mb
    assert all(gone(pid) for pid in watch.seen)
    assert_host_responsive(watch)
    assert_in_a_cgroup_now_gone(watch, limits)


def gone(pid: int, deadline_s: float = 5.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False
