"""Tool code goes after what the kernel keeps per user rather than per namespace (keyrings, inotify
instances, message-queue bytes, queued signals, key quota) and after the descriptors it was started
with; as in tests/integration/test_sandbox_escapes.py each attempt is judged from OUTSIDE by its effect
on the host: a key that never reached the output and was not left behind, quotas that another process
of the run's user can still use while the call hoards, no host file behind a reopened descriptor.
What holds: lean_rl/rollout/seccomp_filter.py (libseccomp, given to bwrap), bwrap run as
bwrap.SANDBOX_HOST_UID when lean_rl is root, the bootstrap's rlimits, pipes for stdio."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyseccomp
import pytest

from lean_rl.rollout import bwrap
from lean_rl.rollout.sandbox import SandboxLimits, SandboxResult, run_python

NR = {name: pyseccomp.resolve_syscall(pyseccomp.system_arch(), name) for name in ("add_key", "keyctl", "request_key")}
KEY_SPEC_SESSION, KEY_SPEC_USER, KEY_SPEC_PROCESS = -3, -4, -2
KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_INVALIDATE = 10, 11, 21
PRELUDE = f"""import ctypes, json, os, signal, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def err(): return os.strerror(ctypes.get_errno())
NR = {NR!r}
"""
libc = ctypes.CDLL(None, use_errno=True)


def run(code: str, **limits) -> SandboxResult:
    return asyncio.run(run_python(PRELUDE + code, SandboxLimits(**limits)))


def host_search(keyring: int, description: bytes) -> int:
    """The key's id in this (host) process's keyring, or -1."""
    return libc.syscall(NR["keyctl"], KEYCTL_SEARCH, keyring, b"user", description, 0)


@pytest.fixture
def host_keys():
    """A secret in the run user's keyring and one in the session keyring this process hands down."""
    secret, marker = uuid.uuid4().hex, f"lean_rl_test_key_{uuid.uuid4().hex}"
    ids = [libc.syscall(NR["add_key"], b"user", marker.encode(), secret.encode(), len(secret), ring)
           for ring in (KEY_SPEC_USER, KEY_SPEC_SESSION)]
    assert all(key > 0 for key in ids), os.strerror(ctypes.get_errno())
    yield secret, marker
    for key in ids:
        libc.syscall(NR["keyctl"], KEYCTL_INVALIDATE, key)


def test_keyrings_neither_read_nor_written(host_keys):
    secret, marker = host_keys
    left = f"{marker}_left"
    result = run(f"""for ring in (-4, -3):  # the user's and the inherited session keyring
    key = libc.syscall(NR['keyctl'], {KEYCTL_SEARCH}, ring, b'user', {marker.encode()!r}, 0)
    print('search', ring, key, err())
    buf = ctypes.create_string_buffer(256)
    for guess in range(1, 2000):  # key ids are small serials: read whichever answers
        if libc.syscall(NR['keyctl'], {KEYCTL_READ}, guess, buf, 256) > 0:
            print('read', guess, buf.value)
    print('request', libc.syscall(NR['request_key'], b'user', {marker.encode()!r}, None, 0), err())
    print('add', libc.syscall(NR['add_key'], b'user', {left.encode()!r}, b'x', 1, ring), err())
fd = libc.open(b'/proc/keys', os.O_RDONLY)
print('proc/keys', fd, os.read(fd, 65536) if fd >= 0 else err())""")
    assert secret not in result.stdout + result.stderr, result
    assert marker not in result.stdout + result.stderr, result  # not even the description (/proc/keys)
    assert result.stdout.count("Operation not permitted") >= 6, result  # the filter: search, request, add
    for ring in (KEY_SPEC_USER, KEY_SPEC_SESSION):
        assert host_search(ring, left.encode()) == -1, ring  # nothing left behind


# The call hoards every per-user object it can, then holds them; meanwhile a process of the run's user
# keeps taking (and giving back) one of each. Without the boundary's fixes the call runs as the run's
# user and takes the user's whole quota (inotify 128 instances, RLIMIT_MSGQUEUE bytes, RLIMIT_SIGPENDING
# queued signals, the key quota): the host process then fails.
HOARD = """counts = {}
n = 0
while n < 1000 and libc.inotify_init1(0) >= 0: n += 1
counts['inotify'] = (n, err())
class Attr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long), ('msgsize', ctypes.c_long),
                ('curmsgs', ctypes.c_long), ('pad', ctypes.c_long * 4)]
attr, n = Attr(0, 10, 8192, 0), 0
while n < 1000 and libc.mq_open(b'/hoard%d' % n, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr)) >= 0: n += 1
counts['mqueue'] = (n, err())
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
n = 0
while n < 200000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) == 0: n += 1
counts['sigpending'] = (n, err())
n = 0
while n < 5000 and libc.syscall(NR['add_key'], b'user', b'hoard%d' % n, b'x' * 16384, 16384, -2) > 0: n += 1
counts['keys'] = (n, err())
print(json.dumps(counts), flush=True)
time.sleep(HOLD)"""

HOST_PROBE = r"""import ctypes, json, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
add_key, keyctl, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
class Attr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long), ('msgsize', ctypes.c_long),
                ('curmsgs', ctypes.c_long), ('pad', ctypes.c_long * 4)]
failed, tries, name = {}, 0, b'/lean_rl_probe_%d' % os.getpid()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
def check(what, ok):
    if not ok:
        failed.setdefault(what, os.strerror(ctypes.get_errno()))
end = time.monotonic() + seconds
while time.monotonic() < end:
    fd = libc.inotify_init1(0)
    check('inotify', fd >= 0) or fd < 0 or os.close(fd)
    q = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(Attr(0, 10, 8192, 0)))
    check('mqueue', q >= 0)
    if q >= 0:
        libc.mq_close(q); libc.mq_unlink(name)
    check('sigpending', libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) == 0)
    signal.sigtimedwait([signal.SIGRTMIN], 0)
    key = libc.syscall(add_key, b'user', b'lean_rl_probe', b'x' * 16384, 16384, -2)
    check('keys', key > 0)
    if key > 0:
        libc.syscall(keyctl, 9, key, -2)  # KEYCTL_UNLINK from the process keyring: freed
    tries += 1
    time.sleep(0.05)
print(json.dumps({'failed': failed, 'tries': tries}))"""


def uids_of_descendants(pid: int, besides: int) -> dict[str, set[int]]:
    """comm -> real uids of `pid`'s descendants now (from the host's /proc), `besides` left out."""
    parents, found = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    frontier, seen = {pid}, set()
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - seen
        seen |= frontier
    for child in seen - {besides}:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        found.setdefault(fields["Name"].strip(), set()).add(int(fields["Uid"].split()[0]))
    return found


def test_per_user_quotas_stay_with_the_run_while_a_call_hoards():
    hold = 3.0
    probe = subprocess.Popen([sys.executable, "-c", HOST_PROBE, str(NR["add_key"]), str(NR["keyctl"]),
                              str(hold + 2.0)], stdout=subprocess.PIPE, text=True)
    uids: dict[str, set[int]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for name, found in uids_of_descendants(os.getpid(), probe.pid).items():
                uids.setdefault(name, set()).update(found)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run(f"HOLD = {hold}\n" + HOARD, wall_timeout_s=hold + 5, cpu_seconds=10)
    finally:
        done.set()
        watcher.join()
        out, _ = probe.communicate(timeout=30)
    host = json.loads(out)
    assert host["tries"] > 20 and host["failed"] == {}, host  # the run's user kept every quota
    assert result.status == "ok", result
    counts = json.loads(result.stdout)
    for kind in ("inotify", "mqueue", "keys"):
        assert counts[kind] == [0, "Operation not permitted"], counts  # the seccomp filter
    assert counts["sigpending"][0] <= SandboxLimits().max_pending_signals, counts  # RLIMIT_SIGPENDING
    if bwrap.switches_user():  # the call's kernel identity is not the run's: bwrap and the interpreter
        assert uids.get("bwrap") == {bwrap.SANDBOX_HOST_UID}, uids
        # (other "python" descendants of this test process, a session's servers, run as the run's user)
        assert any(name.startswith("python") and bwrap.SANDBOX_HOST_UID in found
                   for name, found in uids.items()), uids


def test_no_host_descriptor_to_reopen():
    """stdin, stdout and stderr are pipes, the code came through a memfd bwrap copied in: reopening
    /proc/self/fd/N gives no handle on a host file, writable or not."""
    result = run("""import stat
fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))
print('fds', fds)
for n in fds:
    try:
        kind = stat.S_IFMT(os.fstat(n).st_mode)
    except OSError:
        continue  # the listing's own descriptor, closed by now
    print(n, 'fifo' if kind == stat.S_IFIFO else oct(kind), os.readlink('/proc/self/fd/%d' % n))
    for flags in (os.O_RDWR, os.O_WRONLY, os.O_RDONLY):
        fd = libc.open(b'/proc/self/fd/%d' % n, flags)
        print('reopen', n, flags, fd, err())
        if fd >= 0:
            print('fchmod', libc.fchmod(fd, 0o6777), err())""")
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    assert lines[0] in ("fds [0, 1, 2, 3]", "fds [0, 1, 2]"), lines  # nothing else was inherited
    assert all(line.split()[1] == "fifo" for line in lines[1:] if line.split()[0] in ("0", "1", "2")), lines
    assert not any(line.startswith("reopen") and int(line.split()[3]) >= 0 for line in lines), lines
