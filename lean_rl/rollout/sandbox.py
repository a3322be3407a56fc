"""Run a snippet of Python for an agent's tool call, in a separate, limited process.

The boundary (the default, `--tool-sandbox bwrap`) is bubblewrap: every call runs in new user, PID,
network, IPC, UTS and mount namespaces that see only the system directories and the Python runtime
(read-only) and a tmpfs working directory; lean_rl/rollout/bwrap.py lists exactly what the call sees.
A run whose hooks import this module checks at start-up that bwrap builds that boundary here
(lean_rl/preflight.py, check_tool_sandbox) and refuses to start otherwise; `run_python` itself never
runs code unisolated under bwrap: it raises BoundaryUnavailable instead. `--tool-sandbox none` runs the
child on the host, with only the limits and the audit hook below, and logs a warning on every call.

Enforced on every call, and how:
- A fresh interpreter (`python -I -S -B -u -X utf8`: isolated mode, no PYTHON* variables, no user site;
  site-packages on sys.path without their .pth files), a
  nearly empty environment, cwd = a fresh working directory (bwrap: a tmpfs of `tmpfs_mb`; none: a host
  temporary directory), deleted afterwards. The code is read from outside it (bwrap: a memfd copied in, read-
  only; none: a host file); stdin, stdout and stderr are pipes: no host file is handed over as a descriptor.
- Kernel limits, set by the bootstrap in the child before any user code runs
  (lean_rl/rollout/sandbox_bootstrap.py), hard = soft: RLIMIT_CPU (SIGXCPU -> "cpu_limit"), RLIMIT_AS
  (MemoryError -> "memory_limit"), RLIMIT_FSIZE (writes past it fail with "File too large"), RLIMIT_CORE=0,
  RLIMIT_MSGQUEUE=0, RLIMIT_SIGPENDING = `max_pending_signals`, RLIMIT_NOFILE = `max_open_files`, and
  under bwrap RLIMIT_NPROC = `max_processes` (counted for the sandbox's uid in its own user namespace;
  when lean_rl runs as root, bwrap runs as an unprivileged uid of its own, bwrap.SANDBOX_HOST_UID, so the
  limit holds there too). RLIMIT_CPU, RLIMIT_AS and RLIMIT_NOFILE are per process.
- Under bwrap a seccomp filter (lean_rl/rollout/seccomp_filter.py, built with libseccomp) refuses the
  keyring, inotify, message-queue, mount, ptrace, BPF... calls; no libseccomp, no call (BoundaryUnavailable).
- A cgroup per call (under bwrap, where the machine offers one: lean_rl/rollout/cgroups.py, made with
  cgroup-tools): pids.max = max_processes + 1 and a memory limit of `call_memory_mb` (resident memory
  and tmpfs files) for all of the call's processes together, whoever they run as, root included. A call
  the OOM killer hit ends "memory_limit"; a fork past pids.max fails with EAGAIN. This part alone fails
  open: where no cgroup can be made (no cgroup-tools, no pids/memory hierarchy, no permission) calls run
  without it, and the start-up line (`limits_in_force`) and a warning say so and why.
- Wall clock: past `wall_timeout_s` the process group lean_rl started (bwrap, or the child under none) gets
  SIGKILL, also when the child exits early or the call is cancelled. Under bwrap that kills the PID
  namespace's init (--die-with-parent) and with it every process of the namespace, setsid'd grandchildren
  included; under none a grandchild that left the process group survives.
- Output: read in chunks; stdout and stderr share `max_output_bytes`; past it the group is killed
  ("output_limit"), so the parent never holds more than the cap and the child never blocks on a full pipe.
- A `sys.addaudithook` hook gives a friendly early error for the common mistakes (connecting a socket,
  opening files outside the working directory, subprocess/os.system/os.fork/os.exec*, killing another
  pid, setrlimit). It is NOT a boundary: ctypes, native code, `dir_fd` and races get past it; under
  bwrap the namespaces and mounts stop what gets past it, under none nothing does.

Statuses (closed set): "ok" (exit 0), "error" (non-zero exit, uncaught exception, refused operation, killed
by a signal not ours), "timeout", "cpu_limit", "memory_limit" (a MemoryError at RLIMIT_AS, or the call's
cgroup OOM-killed one of its processes and it did not exit 0; before "timeout": a memory hog that the OOM
killer keeps down until the wall clock ends it reads as what went wrong), "output_limit". A fork bomb held
at pids.max or RLIMIT_NPROC runs until the wall clock: "timeout". Under bwrap an exit status
above 128 reads as a signal (bwrap's init reports a killed child as 128 + its number)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import site
import sys
import tempfile
import time
from dataclasses import dataclass

from lean_rl.rollout import bwrap, cgroups, seccomp_filter
from lean_rl.rollout.bwrap import TOOL_SANDBOXES, BoundaryUnavailable
from lean_rl.rollout.cgroups import CallCgroup, CgroupUnavailable
from lean_rl.rollout.sandbox_bootstrap import BOOTSTRAP, MEMORY_EXIT
from lean_rl.rollout.sandbox_output import OutputCollector, SandboxResult, kill_group
from lean_rl.rollout.seccomp_filter import SeccompUnavailable

__all__ = ["STATUSES", "BoundaryUnavailable", "SandboxLimits", "SandboxResult", "limits_in_force", "run_python",
           "use_backend"]

logger = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit")



@dataclass(frozen=True)
class SandboxLimits:
    wall_timeout_s: float = 5.0      # wall clock; the whole process group is killed past it
    cpu_seconds: int = 5             # RLIMIT_CPU
    memory_mb: int = 512             # RLIMIT_AS
    max_output_bytes: int = 16_384   # stdout+stderr kept; past it the process group is killed
    max_file_bytes: int = 1_048_576  # RLIMIT_FSIZE
    max_processes: int = 16          # bwrap: RLIMIT_NPROC in its user namespace, and the cgroup's pids.max
                                     # (+1: bwrap itself): processes + threads
    call_memory_mb: int = 1024       # bwrap, where a cgroup is in force: memory of all the call's processes
                                     # together (resident + its tmpfs files); past it the OOM killer acts
    tmpfs_mb: int = 64               # bwrap: size of the working directory's tmpfs (and of /dev/shm's)
    max_pending_signals: int = 32    # RLIMIT_SIGPENDING: queued signals (counted per user, not by cgroups)
    max_open_files: int = 128        # RLIMIT_NOFILE, per process


# The run's choice (--tool-sandbox, set once at start-up by preflight.check_tool_sandbox) and the bwrap
# proven to build the boundary here (probed once per process, by that check or by the first call).
_backend = "bwrap"
_proven_bwrap: str | None = None
# The cgroup hierarchy proven to bound calls here (cgroups.probe, once per process), or why none does.
_cgroup: cgroups.Hierarchy | None = None
_no_cgroup_because: str | None = None


def use_backend(name: str) -> None:
    global _backend
    if name not in TOOL_SANDBOXES:
        raise ValueError(f"--tool-sandbox must be one of {TOOL_SANDBOXES}, got {name!r}")
    _backend = name


def check_boundary() -> str:
    """The bwrap that builds the boundary here (probed once: bwrap.probe); BoundaryUnavailable otherwise."""
    global _proven_bwrap
    if _proven_bwrap is None:
        path = bwrap.find_bwrap()
        bwrap.probe(path)
        _proven_bwrap = path
    return _proven_bwrap


async def check_cgroups() -> cgroups.Hierarchy | None:
    """The hierarchy that bounds each call here (probed once per process), or None: then a warning (once)
    says why, and calls run without a cgroup (this part alone fails open)."""
    global _cgroup, _no_cgroup_because
    if _cgroup is None and _no_cgroup_because is None:
        try:
            _cgroup = await cgroups.probe()
        except CgroupUnavailable as err:
            _no_cgroup_because = str(err)
            logger.warning("tool sandbox: NO cgroup pids/memory limit on tool calls (%s); calls run without it",
                           _no_cgroup_because)
    return _cgroup


def limits_in_force() -> str:
    """One line for the start-up log: what isolates a call and what bounds its processes and memory.
    Called outside an event loop (start-up)."""
    if _backend == "none":
        return ("tool sandbox: NONE (--tool-sandbox none): tool code runs on the host with only rlimits and an "
                "audit hook; it can read, write and connect wherever this process can")
    path = check_boundary()
    hierarchy = asyncio.run(check_cgroups())
    if hierarchy is not None:
        cgroup = (f"cgroup pids/memory limit IN FORCE ({hierarchy.describe()}, via cgroup-tools): pids.max = "
                  "max_processes + 1 and call_memory_mb for all of a call's processes together")
    else:
        cgroup = (f"NO cgroup pids/memory limit ({_no_cgroup_because}): fail-open for this part only, calls run "
                  "without it (the namespace boundary above stays required)")
    if bwrap.switches_user():
        who = f"bwrap runs as uid/gid {bwrap.SANDBOX_HOST_UID} (lean_rl runs as root; per-user kernel counts are its)"
    else:
        who = f"bwrap runs as lean_rl's uid {os.geteuid()}"
    denied = len(seccomp_filter.denied_names())
    return (f"tool sandbox: {bwrap.version(path)} ({path}): new user/pid/net/ipc/uts/mount namespaces, read-only "
            f"system and Python runtime, tmpfs working dir, stdio through pipes; {who}; seccomp (libseccomp) "
            f"refuses {denied} calls ({', '.join(seccomp_filter.DENIED)}); per call: rlimits CPU = cpu_seconds, "
            f"AS = memory_mb, NPROC = max_processes (in the call's user namespace), FSIZE = max_file_bytes, "
            f"NOFILE = max_open_files, SIGPENDING = max_pending_signals, MSGQUEUE = 0, CORE = 0, 2 x tmpfs_mb of "
            f"files; {cgroup}")


async def _call_cgroup(limits: SandboxLimits) -> CallCgroup | None:
    """A new cgroup for one call, or None (with a warning when a cgroup was in force but cannot be made now)."""
    hierarchy = await check_cgroups()
    if hierarchy is None:
        return None
    call = CallCgroup(hierarchy, limits.max_processes, limits.call_memory_mb)
    try:
        await call.create()
    except CgroupUnavailable as err:
        logger.warning("tool sandbox: this call runs WITHOUT its cgroup pids/memory limit: %s", err)
        return None
    return call


async def _release(call: CallCgroup) -> int:
    """After the call (its namespace killed): how many of its processes the OOM killer killed; delete the cgroup."""
    try:
        return await call.oom_kills()
    except CgroupUnavailable as err:
        logger.warning("tool sandbox: could not read a call's OOM kills: %s", err)
        return 0
    finally:
        await call.delete()


def _site_dirs() -> list[str]:
    """This interpreter's site-packages (the venv's), for the child to import from."""
    return [path for path in site.getsitepackages() if os.path.isdir(path)]


async def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Run `code` in a sandboxed child interpreter (see the module docstring) and collect what it printed.
    Under bwrap, BoundaryUnavailable when bwrap cannot build the boundary here (the code is not run)."""
    if _backend == "none":
        logger.warning("--tool-sandbox none: this tool call runs on the host, unisolated (only rlimits and an "
                       "audit hook): it can read, write and connect wherever lean_rl can")
        bwrap_path = None
    else:
        bwrap_path = _proven_bwrap or await asyncio.to_thread(check_boundary)
    start = time.monotonic()
    call_cgroup = await _call_cgroup(limits) if bwrap_path is not None else None
    oom_kills = 0
    try:
        collector, rc, timed_out = await _run(code, limits, stdin, bwrap_path, call_cgroup)
    finally:  # the namespace is dead by now (also after a timeout or a cancellation)
        if call_cgroup is not None:
            oom_kills = await _release(call_cgroup)
    if collector.over_cap:
        status = "output_limit"
    elif oom_kills and rc != 0:
        status = "memory_limit"
    elif timed_out:
        status = "timeout"
    elif rc == -signal.SIGXCPU:
        status = "cpu_limit"
    elif rc == MEMORY_EXIT:
        status = "memory_limit"
    else:
        status = "ok" if rc == 0 else "error"
    out, err = (collector.kept[fd].decode("utf-8", "replace") for fd in (1, 2))
    return SandboxResult(status, out, err, rc, collector.over_cap, time.monotonic() - start)


async def _run(code: str, limits: SandboxLimits, stdin: str, bwrap_path: str | None,
               call_cgroup: CallCgroup | None) -> tuple[OutputCollector, int | None, bool]:
    """Start the child (under bwrap: in the call's cgroup, when there is one) and wait for it: what it
    printed, its exit status (negative: a signal) and whether the wall clock ended it. No host file is
    handed over as a descriptor: stdin, stdout and stderr are pipes; under bwrap the code is a memfd."""
    with tempfile.TemporaryDirectory(prefix="lean_rl_sandbox_", ignore_cleanup_errors=True) as root:
        workdir = bwrap.WORKDIR if bwrap_path else os.path.join(root, "work")  # bwrap: a tmpfs inside
        code_path = bwrap.CODE_PATH if bwrap_path else os.path.join(root, "code.py")
        cfg = {"code_path": code_path, "workdir": workdir,
               "memory_exit": MEMORY_EXIT, "cpu_seconds": limits.cpu_seconds, "memory_mb": limits.memory_mb,
               "max_file_bytes": limits.max_file_bytes, "site_dirs": _site_dirs(),
               "max_pending_signals": limits.max_pending_signals, "max_open_files": limits.max_open_files,
               # per uid: on the host that would count (and starve) all of this user's processes
               "max_processes": limits.max_processes if bwrap_path else None}
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        python = [sys.executable, "-I", "-S", "-B", "-u", "-X", "utf8", "-c", BOOTSTRAP, json.dumps(cfg)]
        fds: tuple[int, ...] = ()
        if bwrap_path is None:  # the code file stays outside the child's directory
            os.mkdir(workdir, 0o700)
            with open(code_path, "w", encoding="utf-8") as f:
                f.write(code)
            argv, spawn_env, cwd = python, env, workdir
        else:
            try:
                fds = bwrap.boundary_fds(code.encode())
            except SeccompUnavailable as err:
                raise BoundaryUnavailable(f"--tool-sandbox bwrap: {err}; or run unisolated with --tool-sandbox "
                                          "none") from None
            argv = bwrap.bwrap_argv(bwrap_path, *fds, limits.tmpfs_mb << 20, env) + python
            if call_cgroup is not None:
                argv = call_cgroup.exec_prefix + argv
            spawn_env, cwd = {"PATH": os.defpath}, "/"
        try:
            transport, collector = await asyncio.get_running_loop().subprocess_exec(
                lambda: OutputCollector(limits.max_output_bytes), *argv,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=cwd, env=spawn_env, start_new_session=True, pass_fds=fds)
        finally:
            for fd in fds:  # bwrap has its copies (and closes them before the code runs)
                os.close(fd)
        collector.send_stdin(transport, stdin.encode())
        timed_out = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(collector.exited), limits.wall_timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
        finally:  # also on cancellation: nothing of the group (under bwrap: of the namespace) survives the call
            kill_group(collector.pid)  # whatever the child left behind would hold the pipes open
            try:  # reap it before the loop may close; all SIGKILLed: prompt
                await asyncio.wait_for(asyncio.shield(collector.finished), 10.0)
            finally:
                transport.close()
    rc = transport.get_returncode()
    if bwrap_path is not None and rc is not None:
        rc = bwrap.exit_code(rc)
    return collector, rc, timed_out
