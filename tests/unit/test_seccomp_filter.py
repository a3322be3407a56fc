"""lean_rl/rollout/seccomp_filter.py: the filter libseccomp builds, in force in a real bubblewrap sandbox
(each call below succeeds for an unprivileged process without it: the same code under
`--tool-sandbox none` shows that), and no call at all without libseccomp (fail closed)."""

from __future__ import annotations

import asyncio
import json
import sys

import pyseccomp
import pytest

from lean_rl.rollout import sandbox, seccomp_filter
from lean_rl.rollout.bwrap import BoundaryUnavailable
from lean_rl.rollout.sandbox import SandboxLimits, run_python

NR = {name: pyseccomp.resolve_syscall(pyseccomp.system_arch(), name)
      for name in ("keyctl", "get_mempolicy", "kcmp", "io_uring_setup", "clone3", "ptrace")}
# calls an unprivileged process may make, each with harmless arguments
CALLS = f"""import ctypes, json, os, threading
libc = ctypes.CDLL(None, use_errno=True)
NR = {NR!r}
def call(name, *args):
    rc = libc.syscall(NR[name], *args) if name in NR else getattr(libc, name)(*args)
    return 'ok' if rc >= 0 else os.strerror(ctypes.get_errno())
params = ctypes.create_string_buffer(120)
found = {{'keyctl': call('keyctl', 0, -3, 0),  # KEYCTL_GET_KEYRING_ID of the session keyring
         'inotify_init1': call('inotify_init1', 0),
         'get_mempolicy': call('get_mempolicy', None, None, 0, None, 0),
         'kcmp': call('kcmp', os.getpid(), os.getpid(), 0, 0, 0),  # KCMP_FILE 0 vs 0
         'io_uring_setup': call('io_uring_setup', 1, params)}}
"""


def run(code: str) -> dict:
    result = asyncio.run(run_python(code, SandboxLimits(wall_timeout_s=20.0)))
    assert result.status == "ok", result
    return json.loads(result.stdout)


@pytest.fixture
def no_sandbox():
    sandbox.use_backend("none")
    yield
    sandbox.use_backend("bwrap")


def test_the_filter_refuses_what_the_host_allows(no_sandbox):
    on_host = run(CALLS + "print(json.dumps(found))")
    sandbox.use_backend("bwrap")
    inside = run(CALLS + """found['ptrace'] = call('ptrace', 0, 0, 0, 0)  # PTRACE_TRACEME
found['clone3'] = call('clone3', None, 0)
done = []
thread = threading.Thread(target=done.append, args=(1,))  # glibc falls back from clone3 to clone
thread.start(); thread.join()
found['thread'] = 'ok' if done else 'no thread'
fd = libc.open(b'/proc/self/status', os.O_RDONLY)
found['seccomp'] = [line for line in os.read(fd, 4096).decode().splitlines() if line.startswith('Seccomp:')]
print(json.dumps(found))""")
    allowed = {name for name, outcome in on_host.items() if outcome == "ok"}  # io_uring may be off on a host
    assert {"keyctl", "inotify_init1", "get_mempolicy", "kcmp"} <= allowed, on_host
    for name in allowed:
        assert inside[name] == "Operation not permitted", (name, inside)
    assert inside["ptrace"] == "Operation not permitted", inside
    assert inside["clone3"] == "Function not implemented" and inside["thread"] == "ok", inside
    assert inside["seccomp"] == ["Seccomp:\t2"], inside  # mode 2: a filter


@pytest.mark.skipif(pyseccomp.system_arch() != pyseccomp.Arch.X86_64, reason="x32 numbering is x86_64's")
def test_a_call_through_another_abi_kills_the_process():
    # keyctl with the x32 bit: not the architecture the filter was built for (libseccomp's bad-arch check)
    result = asyncio.run(run_python(f"import ctypes; ctypes.CDLL(None).syscall({0x40000000 | NR['keyctl']}, 0, -3, 0)"
                                    "\nprint('survived')"))
    assert result.status == "error" and "SIGSYS" in result.as_observation() and "survived" not in result.stdout


def test_the_program_names_every_group():
    bpf = seccomp_filter.program()
    assert len(bpf) % 8 == 0 and len(bpf) > 8 * len(seccomp_filter.DENIED)
    names = seccomp_filter.denied_names()
    assert len(names) == len(set(names))
    for name in ("add_key", "request_key", "keyctl", "inotify_init", "inotify_init1", "mq_open", "mount",
                 "umount2", "pivot_root", "ptrace", "kexec_load", "init_module", "bpf", "perf_event_open",
                 "userfaultfd", "unshare", "setns", "open_by_handle_at"):
        assert name in names, name


@pytest.fixture
def no_libseccomp(monkeypatch):
    """As on a machine without libseccomp: pyseccomp cannot be imported (it raises without libseccomp.so)."""
    monkeypatch.setitem(sys.modules, "pyseccomp", None)
    seccomp_filter.program.cache_clear()
    yield
    seccomp_filter.program.cache_clear()


def test_without_libseccomp_no_call_runs(no_libseccomp, monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w')"
    # a process that has already proven bwrap (the start-up check), then the filter cannot be built
    with pytest.raises(BoundaryUnavailable, match="libseccomp.*--tool-sandbox none"):
        asyncio.run(run_python(code))
    monkeypatch.setattr(sandbox, "_proven_bwrap", None)  # a fresh process: the start-up probe refuses too
    with pytest.raises(BoundaryUnavailable, match="libseccomp.*apt-get install libseccomp2"):
        sandbox.check_boundary()
    assert not marker.exists()
