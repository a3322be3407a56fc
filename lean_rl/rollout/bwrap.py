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
  the namespace, so nothing the call forked outlives it.

Running as root, the sandbox's uid maps to root outside: without capabilities, but file ownership
checks see root's files as its own. That is why only system directories and the runtime are bound, all
read-only, and /proc/sys is covered (bwrap leaves it writable when its caller is root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

TOOL_SANDBOXES = ("bwrap", "none")  # --tool-sandbox
INSTALL_HINT = "apt-get install bubblewrap"
SANDBOX_UID = 65534  # "nobody" inside the user namespace
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


def _system_mounts() -> list[str]:
    args = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for path in runtime_dirs():
        args += ["--ro-bind", path, path]
    return args


def bwrap_argv(bwrap: str, code_file: str, tmpfs_bytes: int, env: dict[str, str]) -> list[str]:
    """The bwrap options (up to and including `--`) that run a command in the boundary described
    above, with `code_file` (a host file) readable at CODE_PATH and `env` as the whole environment."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += _system_mounts()
    argv += ["--proc", "/proc",
             # bwrap covers /proc/sys only when its caller cannot write there; as root it can
             "--ro-bind-try", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
             "--dev", "/dev",
             "--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev",
             "--perms", "0700", "--size", str(tmpfs_bytes), "--tmpfs", WORKDIR]
    # /tmp is the working directory, unless the runtime itself lives under the host's /tmp (a venv
    # there): then /tmp holds only that read-only bind, and TMPDIR still names the working directory
    if not any(d == "/tmp" or d.startswith("/tmp/") for d in runtime_dirs()):
        argv += ["--symlink", WORKDIR, "/tmp"]
    argv += ["--ro-bind", code_file, CODE_PATH,
             "--chdir", WORKDIR,
             "--remount-ro", "/",
             "--"]
    return argv


def exit_code(bwrap_returncode: int) -> int:
    """The command's exit status as subprocess reports it (negative: killed by that signal): bwrap's
    PID 1 exits with 128 + n when the command was killed by signal n."""
    if bwrap_returncode > 128 and bwrap_returncode - 128 < 65:
        return 128 - bwrap_returncode
    return bwrap_returncode


def probe(bwrap: str, timeout_s: float = 30.0) -> None:
    """Build the whole boundary once and run `python -c pass` in it (the interpreter, the mounts and
    every namespace: a kernel that refuses user namespaces, or a container that forbids mounts, fails
    here); BoundaryUnavailable names the cause."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", prefix="lean_rl_sandbox_probe_", suffix=".py") as code:
        argv = bwrap_argv(bwrap, code.name, 1 << 20, {"PATH": os.defpath}) + [sys.executable, "-I", "-c", "pass"]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise BoundaryUnavailable(f"--tool-sandbox bwrap: {bwrap} could not run ({err}); fix or reinstall it "
                                      f"(`{INSTALL_HINT}`) or run unisolated with --tool-sandbox none") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise BoundaryUnavailable(
            f"--tool-sandbox bwrap: {bwrap} cannot build the sandbox here ({why}); allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, or a container with --security-opt "
            "seccomp/apparmor that permits them) or run unisolated with --tool-sandbox none")


def version(bwrap: str) -> str:
    done = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    return done.stdout.strip() or "bubblewrap"
