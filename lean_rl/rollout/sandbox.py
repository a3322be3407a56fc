"""Run a snippet of Python for an agent's tool call, in a separate, limited process.

Enforced, and how:
- A fresh interpreter (`python -I -B -u -X utf8`: isolated mode, no PYTHON* variables, no user site) in a new
  session (its own process group), with a nearly empty environment, cwd = a fresh temporary directory that
  is deleted afterwards. The code is read from a file, stdin from another (no pipe to deadlock on).
- Kernel limits, set by the bootstrap in the child before any user code runs (not in a `preexec_fn`, which is
  unsafe when the parent has threads, as a rollout process does): RLIMIT_CPU (SIGXCPU -> "cpu_limit"),
  RLIMIT_AS (MemoryError -> "memory_limit"), RLIMIT_FSIZE (writes past it fail with "File too large"),
  RLIMIT_CORE=0. Inside its user namespace (network=False) the child cannot raise its hard limits.
- Wall clock: past `wall_timeout_s` the whole process group (os.killpg on the child's own pgid, nothing
  else) gets SIGKILL; the group is also killed when the child exits, so a left-behind grandchild cannot hold
  the output pipes open or outlive the call.
- Output: read in chunks; stdout and stderr share `max_output_bytes`; past it the group is killed
  ("output_limit"), so the parent never holds more than the cap and the child never blocks on a full pipe.
- Network (unless `network`): the child enters new user + network namespaces (`unshare(CLONE_NEWUSER | CLONE_NEWNET)` via
  ctypes): only a loopback device that is down, so no address is reachable. If the kernel refuses
  (user namespaces disabled), only the audit hook below stands.
- A `sys.addaudithook` hook refuses: socket connect/bind/sendto/sendmsg and name lookups (unless
  `network`); opening files for writing outside the working directory; opening files for reading outside it
  and outside the directories on `sys.path` at start (stdlib, lib-dynload, site-packages: what imports read)
  and /dev/null; removing, renaming, creating, linking, chmod/chown/utime of paths outside the working
  directory; subprocess, os.system, os.exec*, os.posix_spawn, os.fork, os.forkpty, os.killpg, os.kill of
  another pid, resource.setrlimit/prlimit. Paths are resolved with realpath (symlinks followed).
NOT enforced: the audit hook is a guard against mistakes, not a security boundary. ctypes or any native
code bypasses it (raw syscalls, fork, dlopen), `dir_fd` variants and races (TOCTOU) can fool path checks,
directory listing and os.stat outside are allowed, and a raw fork via ctypes can multiply the CPU limit
(RLIMIT_CPU is per process) until the wall timeout kills the group. The real walls are the namespaces and
rlimits; for untrusted code at scale run this inside a container or gVisor sandbox (no secrets mounted).

Statuses (closed set): "ok" (exit 0), "error" (non-zero exit, uncaught exception, refused operation, killed
by a signal not ours), "timeout", "cpu_limit", "memory_limit", "output_limit"."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit")
_MEMORY_EXIT = 86  # the bootstrap's exit code for an uncaught MemoryError

_BOOTSTRAP = r'''
import ctypes, json, linecache, os, resource, sys, traceback, types
cfg = json.loads(sys.argv[1])
with open(cfg["code_path"], encoding="utf-8") as f:
    code = f.read()
if not cfg["network"]:  # CLONE_NEWUSER | CLONE_NEWNET; on failure only the audit hook guards the network
    ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000)
cpu = cfg["cpu_seconds"]
for kind, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_CORE, 0, 0),
                         (resource.RLIMIT_AS, cfg["memory_mb"] << 20, cfg["memory_mb"] << 20),
                         (resource.RLIMIT_FSIZE, cfg["max_file_bytes"], cfg["max_file_bytes"])):
    resource.setrlimit(kind, (soft, hard))
work = os.path.realpath(cfg["workdir"])
readable = (work, *[os.path.realpath(p) for p in sys.path if os.path.isdir(p)])
REFUSED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
           "os.killpg", "resource.setrlimit", "resource.prlimit"}
NETWORK = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
           "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
               "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.copymode",
               "shutil.copystat", "shutil.copytree", "shutil.move", "os.setxattr", "os.removexattr"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def inside(path, roots):
    path = os.path.realpath(os.fsdecode(path))
    return any(path == r or path.startswith(r + os.sep) for r in roots)

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        writing = bool((isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & WRITE_FLAGS)
        if os.fsdecode(path) != "/dev/null" and not inside(path, (work,) if writing else readable):
            raise PermissionError(f"sandbox: {'writing' if writing else 'reading'} {path!r} is not allowed "
                                  "outside the working directory")
    elif event in REFUSED or (event in NETWORK and not cfg["network"]) or (
            event == "os.kill" and args[0] != os.getpid()):
        raise PermissionError(f"sandbox: {event} is not allowed")
    elif event in PATH_EVENTS:
        for path in args:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, (work,)):
                raise PermissionError(f"sandbox: {event} on {path!r} is not allowed outside the working directory")

sys.addaudithook(hook)
sys.argv = ["<sandbox>"]
linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")  # source in tracebacks
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
try:
    exec(compile(code, "<sandbox>", "exec"), main.__dict__)
except SystemExit:
    raise
except BaseException as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # without this bootstrap's frame
    sys.stderr.flush()
    os._exit(cfg["memory_exit"] if isinstance(e, MemoryError) else 1)
'''


@dataclass(frozen=True)
class SandboxLimits:
    wall_timeout_s: float = 5.0      # wall clock; the whole process group is killed past it
    cpu_seconds: int = 5             # RLIMIT_CPU
    memory_mb: int = 512             # RLIMIT_AS
    max_output_bytes: int = 16_384   # stdout+stderr kept; past it the process group is killed
    max_file_bytes: int = 1_048_576  # RLIMIT_FSIZE
    network: bool = False


@dataclass(frozen=True)
class SandboxResult:
    status: str  # one of STATUSES
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal
    truncated: bool
    seconds: float

    def as_observation(self, limit_chars: int = 2000) -> str:
        """Short text for the model's next turn: the output, then what went wrong, if anything."""
        parts = [text.rstrip("\n") for text in (self.stdout, self.stderr) if text.strip()]
        if self.truncated:
            parts.append("[output truncated]")
        if self.status != "ok":
            parts.append(f"[{self._problem()}]")
        text = "\n".join(parts) or "(no output)"
        if len(text) <= limit_chars:
            return text
        room = max(limit_chars - 40, 0)  # 40: the marker's most
        marker = f"\n...[{len(text) - room} characters cut]...\n"
        head = room // 3  # the end of a traceback matters most: keep more of the tail
        return text[:head] + marker + text[len(text) - (room - head):]

    def _problem(self) -> str:
        if self.status == "error":
            code = self.exit_code or 0
            return f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return {"timeout": f"wall-clock timeout: killed after {self.seconds:.1f} s",
                "cpu_limit": "CPU time limit exceeded", "memory_limit": "memory limit exceeded",
                "output_limit": "output limit exceeded: the process was killed"}[self.status]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already empty
        pass  # (its number is not reused while any member lives, so this never hits a stranger's group)


class _Collector(asyncio.SubprocessProtocol):
    """Keeps the first `cap` bytes of stdout+stderr, kills the group past them; notes exit and pipe closing."""

    def __init__(self, cap: int) -> None:
        self.kept = {1: bytearray(), 2: bytearray()}
        self.room, self.over_cap = cap, False
        loop = asyncio.get_running_loop()
        self.exited, self.finished = loop.create_future(), loop.create_future()
        self.pid = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.pid = transport.get_pid()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = data[:self.room]
        self.kept[fd] += kept
        self.room -= len(kept)
        if len(kept) < len(data) and not self.over_cap:
            self.over_cap = True
            _kill_group(self.pid)

    def process_exited(self) -> None:  # the child itself; a grandchild may still hold the pipes
        self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:  # exited and every pipe closed
        self.finished.set_result(None)


async def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Run `code` in a sandboxed child interpreter (see the module docstring) and collect what it printed."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lean_rl_sandbox_", ignore_cleanup_errors=True) as root:
        workdir = os.path.join(root, "work")  # the code and stdin files stay outside the child's directory
        os.mkdir(workdir, 0o700)
        code_path, stdin_path = os.path.join(root, "code.py"), os.path.join(root, "stdin.txt")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        with open(stdin_path, "w", encoding="utf-8") as f:
            f.write(stdin)
        cfg = {"code_path": code_path, "workdir": workdir, "network": limits.network, "memory_exit": _MEMORY_EXIT,
               "cpu_seconds": limits.cpu_seconds, "memory_mb": limits.memory_mb,
               "max_file_bytes": limits.max_file_bytes}
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        with open(stdin_path, "rb") as stdin_file:
            transport, collector = await asyncio.get_running_loop().subprocess_exec(
                lambda: _Collector(limits.max_output_bytes),
                sys.executable, "-I", "-B", "-u", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(cfg),
                stdin=stdin_file, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=workdir, env=env, start_new_session=True)
        timed_out = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(collector.exited), limits.wall_timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
        finally:  # also on cancellation: nothing of the group survives the call
            _kill_group(collector.pid)  # whatever the child left behind would hold the pipes open
            try:  # reap it before the loop may close; all SIGKILLed: prompt
                await asyncio.wait_for(asyncio.shield(collector.finished), 10.0)
            finally:
                transport.close()
    rc = transport.get_returncode()
    if collector.over_cap:
        status = "output_limit"
    elif timed_out:
        status = "timeout"
    elif rc == -signal.SIGXCPU:
        status = "cpu_limit"
    elif rc == _MEMORY_EXIT:
        status = "memory_limit"
    else:
        status = "ok" if rc == 0 else "error"
    out, err = (collector.kept[fd].decode("utf-8", "replace") for fd in (1, 2))
    return SandboxResult(status, out, err, rc, collector.over_cap, time.monotonic() - start)
