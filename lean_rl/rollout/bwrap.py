"""The isolation boundary of a tool call: the bubblewrap (`bwrap`) command line that runs it, and the
start-up probe that proves bwrap can build that boundary on this machine.

What the command line gives the call (each by bubblewrap, i.e. by the kernel's namespaces and mounts):
- new user, PID, network, IPC, UTS, cgroup and mount namespaces (`--unshare-all --unshare-user`); no
  nested user namespace (`--disable-userns`); uid/gid 65534 inside, no capabilities (`--cap-drop ALL`);
- a filesystem of its own: an empty read-only root; the system directories (/usr and the /bin, /lib...
  links or directories) and the Python runtime (the venv and the interpreter it was made from) bound
  read-only at their own paths; a few files of /etc that the dynamic loader reads; the code file
  read-only; a private /proc of the PID namespace with /proc/sys read-only, a minimal /dev (null, zero,
  random, urandom, tty...) read-only; the working directory (also /tmp, HOME and TMPDIR) and /dev/shm
  as size-bounded tmpfs mounts, the only writable places, gone with the namespace. Nothing else of
  the host exists there: no $HOME, no project tree, no --save or --output-dir, no host /tmp;
- no network: only the namespace's own loopback (no host listener is on it; abstract unix sockets
  are per network namespace, so the host's are unreachable too);
- a new session (`--new-session`: no TIOCSTI into a terminal) and `--die-with-parent`: when the bwrap
  process lean_rl started is killed, the namespace's PID 1 dies and the kernel kills every process of
  the namespace, so nothing the call forked outlives it;
- a seccomp filter (`--seccomp FD`, lean_rl/rollout/seccomp_filter.py: keyrings, inotify, message
  queues, mounts, ptrace, BPF... fail with EPERM), installed by bwrap just before it execs the code;
- no host file as a descriptor: the code comes through a memfd that bwrap copies into the sandbox
  (`--ro-bind-data`), stdin/stdout/stderr are pipes; /proc/keys and /proc/key-users read as empty.

When lean_rl runs as root, bwrap itself runs as SANDBOX_HOST_UID (setpriv, util-linux), an unprivileged
uid of its own: the user namespace it makes is owned by that uid and the call's uid 65534 maps to it,
so everything the kernel charges per user (processes, pending signals, inotify instances, message-queue
bytes, key quota; counted up the user-namespace tree to the namespace's owner) is that uid's, not
root's, and root's files are "other" to the call. A runtime directory that uid cannot reach (a
Python under /root, 0700) is first bind-mounted onto a world-traversable empty directory in a private
mount namespace of the call (unshare + mount, util-linux), and bound from there.
Why 1_900_000_000: above the ranges Debian and systemd hand out (0-59999 users and system, 60000-65535
reserved / DynamicUser / nobody, 524288-1879048191 systemd-nspawn's container range) and below 2**31
(tools that read uids as signed 32-bit); not 65534 "nobody", which other daemons run as (a process of
theirs could then signal or ptrace the call, and they would share its per-user quotas). The start-up
probe refuses it if this machine's passwd names it (then someone else uses it).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

from lean_rl.rollout import seccomp_filter
from lean_rl.rollout.seccomp_filter import SeccompUnavailable

TOOL_SANDBOXES = ("bwrap", "none")  # --tool-sandbox
INSTALL_HINT = "apt-get install bubblewrap"
SANDBOX_UID = 65534  # "nobody" inside the user namespace
SANDBOX_HOST_UID = 1_900_000_000  # bwrap's uid and gid outside when lean_rl runs as root (see above for why)
WORKDIR = "/sandbox"  # the call's working directory inside the sandbox (also HOME, TMPDIR and /tmp)
CODE_PATH = "/run/lean_rl/code.py"  # the code, bound read-only, outside the working directory
# what the dynamic loader and libc read, where the host has them
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class BoundaryUnavailable(RuntimeError):
    """bwrap cannot build the sandbox here; the message is one line naming the cause and the fix."""


def find_bwrap() -> str:
    """The bwrap binary on PATH, or BoundaryUnavailable."""
    path = shutil.which("bwrap")
    if path is None:
        raise BoundaryUnavailable(
            f"--tool-sandbox bwrap: no `bwrap` on PATH, so tool code cannot be isolated; install it "
            f"(`{INSTALL_HINT}`, or bash scripts/setup.sh as root) or run unisolated with --tool-sandbox none")
    return path


def runtime_dirs() -> list[str]:
    """The Python runtime's directories outside the system ones: the venv and the interpreter it was
    made from, each bound at the path the child interpreter looks it up by."""
    dirs = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    return sorted({d for d in dirs if not d.startswith(("/usr/", "/bin/", "/lib")) and d != "/usr"})


def switches_user() -> bool:
    """bwrap runs as SANDBOX_HOST_UID: lean_rl runs as root."""
    return os.geteuid() == 0


def _reachable_by_others(path: str) -> bool:
    """Every directory on the way to `path`, itself included, lets "other" users through (ACLs aside: bwrap
    then fails, loudly, at the start-up probe)."""
    real = os.path.realpath(path)
    parts = real.strip(os.sep).split(os.sep)
    ways = [os.sep + os.sep.join(parts[:i]) for i in range(len(parts) + 1)] if real != os.sep else [os.sep]
    return all(os.stat(way).st_mode & 0o001 for way in ways)


_staging: dict[str, str] = {}  # runtime dir -> the empty directory it is mounted on for the call (this process)


def _bind_sources() -> dict[str, str]:
    """Runtime dir -> where bwrap binds it from: itself, or (running as root, a dir SANDBOX_HOST_UID cannot
    reach) an empty world-traversable directory that the call's private mount namespace mounts it on."""
    sources = {}
    for path in runtime_dirs():
        if switches_user() and not _reachable_by_others(path):
            if path not in _staging:
                _staging[path] = tempfile.mkdtemp(prefix="lean_rl_runtime_")
                os.chmod(_staging[path], 0o755)
                atexit.register(shutil.rmtree, _staging[path], ignore_errors=True)  # empty: mounts are the call's
            sources[path] = _staging[path]
        else:
            sources[path] = path
    return sources


def _system_mounts(sources: dict[str, str]) -> list[str]:
    args = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for path, source in sources.items():
        args += ["--ro-bind", source, path]
    return args


def launch_prefix(sources: dict[str, str]) -> list[str]:
    """What runs before bwrap: as root, mount the staged runtime dirs (a private mount namespace: nothing
    shows on the host) and switch to SANDBOX_HOST_UID; otherwise nothing."""
    if not switches_user():
        return []
    prefix = []
    staged = [arg for path, source in sources.items() if source != path for arg in (path, source)]
    if staged:
        script = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 125; shift 2; done; shift; exec "$@"'
        prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *staged, "--"]
    uid = str(SANDBOX_HOST_UID)
    return prefix + ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def bwrap_argv(bwrap: str, code_fd: int, seccomp_fd: int, tmpfs_bytes: int, env: dict[str, str]) -> list[str]:
    """The command (up to and including bwrap's `--`) that runs a command in the boundary described above,
    with the contents of `code_fd` readable at CODE_PATH, the filter of `seccomp_fd` (seccomp_filter) in
    force and `env` as the whole environment. Spawn it with pass_fds=(code_fd, seccomp_fd)."""
    sources = _bind_sources()
    argv = [*launch_prefix(sources), bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += _system_mounts(sources)
    argv += ["--proc", "/proc",
             # bwrap covers /proc/sys only when its caller cannot write there; as root it can
             "--ro-bind-try", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    for path in ("/proc/keys", "/proc/key-users"):  # keys the call possesses through the inherited session
        if os.path.exists(path):                    # keyring, by description (absent: a kernel without keys)
            argv += ["--ro-bind", "/dev/null", path]
    argv += ["--dev", "/dev",
             "--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev",
             "--perms", "0700", "--size", str(tmpfs_bytes), "--tmpfs", WORKDIR]
    # /tmp is the working directory, unless the runtime itself lives under the host's /tmp (a venv
    # there): then /tmp holds only that read-only bind, and TMPDIR still names the working directory
    if not any(d == "/tmp" or d.startswith("/tmp/") for d in runtime_dirs()):
        argv += ["--symlink", WORKDIR, "/tmp"]
    argv += ["--perms", "0444", "--ro-bind-data", str(code_fd), CODE_PATH,
             "--seccomp", str(seccomp_fd),
             "--chdir", WORKDIR,
             "--remount-ro", "/",
             "--"]
    return argv


def boundary_fds(code: bytes) -> tuple[int, int]:
    """(code_fd, seccomp_fd) for bwrap_argv: memfds, no host file; SeccompUnavailable without libseccomp.
    The caller closes both once bwrap has started."""
    seccomp_fd = seccomp_filter.program_fd()
    code_fd = -1
    try:
        code_fd = os.memfd_create("lean_rl_code")
        rest = memoryview(code)
        while rest:
            rest = rest[os.write(code_fd, rest):]
        os.lseek(code_fd, 0, os.SEEK_SET)
    except BaseException:
        for fd in (code_fd, seccomp_fd):
            if fd >= 0:
                os.close(fd)
        raise
    return code_fd, seccomp_fd


def exit_code(bwrap_returncode: int) -> int:
    """The command's exit status as subprocess reports it (negative: killed by that signal): bwrap's
    PID 1 exits with 128 + n when the command was killed by signal n."""
    if bwrap_returncode > 128 and bwrap_returncode - 128 < 65:
        return 128 - bwrap_returncode
    return bwrap_returncode


def probe(bwrap: str, timeout_s: float = 30.0) -> None:
    """Build the whole boundary once and run `python -c pass` in it (the interpreter, the mounts, every
    namespace, the seccomp filter and, as root, the switch to SANDBOX_HOST_UID: a kernel that refuses
    user namespaces or seccomp, or a container that forbids mounts, fails here); BoundaryUnavailable
    names the cause."""
    fix = "or run unisolated with --tool-sandbox none"
    if switches_user():
        try:
            taken = pwd.getpwuid(SANDBOX_HOST_UID).pw_name
        except KeyError:
            taken = None
        if taken is not None:
            raise BoundaryUnavailable(f"--tool-sandbox bwrap: uid {SANDBOX_HOST_UID}, which tool calls run as when "
                                      f"lean_rl runs as root, belongs to user {taken!r} here; free it, run lean_rl "
                                      f"as an unprivileged user, {fix}")
        sources = _bind_sources()
        tools = ["setpriv"] + (["unshare", "mount", "sh"] if any(s != d for d, s in sources.items()) else [])
        missing = [tool for tool in tools if shutil.which(tool, path=os.defpath) is None]
        if missing:
            raise BoundaryUnavailable(f"--tool-sandbox bwrap: no {', '.join(missing)} on {os.defpath} (util-linux, "
                                      f"mount), which start tool calls as uid {SANDBOX_HOST_UID} when lean_rl runs as "
                                      f"root: `apt-get install util-linux mount`, run lean_rl as an unprivileged "
                                      f"user, {fix}")
    try:
        code_fd, seccomp_fd = boundary_fds(b"")
    except SeccompUnavailable as err:
        raise BoundaryUnavailable(f"--tool-sandbox bwrap: {err}; {fix}") from None
    try:
        argv = bwrap_argv(bwrap, code_fd, seccomp_fd, 1 << 20, {"PATH": os.defpath}) + [sys.executable, "-I", "-c",
                                                                                         "pass"]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
                              pass_fds=(code_fd, seccomp_fd))
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BoundaryUnavailable(f"--tool-sandbox bwrap: {bwrap} could not run ({err}); fix or reinstall it "
                                  f"(`{INSTALL_HINT}`) {fix}") from None
    finally:
        os.close(code_fd)
        os.close(seccomp_fd)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise BoundaryUnavailable(
            f"--tool-sandbox bwrap: {bwrap} cannot build the sandbox here ({why}); allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, or a container with --security-opt "
            f"seccomp/apparmor that permits them) {fix}")


def version(bwrap: str) -> str:
    done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    return done.stdout.strip() or "bubblewrap"
