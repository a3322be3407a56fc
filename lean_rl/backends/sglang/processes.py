"""Child processes (SGLang servers, the router) that never outlive their parent and stop as a tree.

Each child starts in its own session (so its whole tree can be signalled as one process group and a
Ctrl-C in the terminal does not hit it half-way) with PR_SET_PDEATHSIG=SIGKILL, so it dies when the
process that started it dies, even by SIGKILL. SGLang's own children (scheduler, detokenizer) set
PDEATHSIG themselves (sglang/srt/utils/common.py:3432 kill_itself_when_parent_died) and its
resource tracker exits when its pipe closes, so killing the server process takes the tree down.
Caveat of PDEATHSIG: it fires when the *thread* that forked the child exits; start children from a
thread that lives as long as they should (the main thread, normally).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

_PR_SET_PDEATHSIG = 1
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt): ")


# Resolved here, in the parent: the child between fork and exec should only make the call
# (no dlopen there, which could block on a lock another thread of the parent held at fork time).
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ChildProcess:
    """A started child with its log file; `name` appears in every error message about it."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.name = name
        self.cmd = cmd
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Appending keeps earlier runs (restarts); this run's text starts at this offset.
            self._log_offset = log.tell()
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _log_text(self, max_bytes: int) -> str:
        """This run's log output, at most its last `max_bytes` (logs of long runs get big)."""
        with open(self.log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(self._log_offset, size - max_bytes))
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "".join(deque(self._log_text(256 * 1024).splitlines(keepends=True), maxlen=lines))
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"

    def last_error_line(self) -> str | None:
        """The last `SomeError: message` line of the log (a Python exception), if any."""
        for line in reversed(self.log_tail(200).splitlines()):
            if _EXCEPTION_LINE.match(line):
                return line.strip()
        return None

    def log_contains(self, needle: str) -> bool:
        """Whether this run's log (its last 1 MB) contains `needle`; polled while the child starts."""
        try:
            return needle in self._log_text(1024 * 1024)
        except OSError:
            return False

    def tree_pids(self) -> list[int]:
        """This process and every live descendant (empty once all are gone)."""
        try:
            root = psutil.Process(self.pid)
            return [self.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout_s: float = 15.0) -> None:
        stop_all([self], timeout_s)


def stop_all(children: list[ChildProcess], timeout_s: float = 15.0) -> None:
    """SIGTERM each child's process group and every known descendant (all children at once, so the
    graceful shutdowns overlap), wait up to `timeout_s`, then SIGKILL whatever is left."""
    descendants: list[psutil.Process] = []
    for child in children:
        for pid in child.tree_pids()[1:]:
            try:
                descendants.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
    # Signal a group only while its leader is unreaped: afterwards its pid (= the pgid) may be reused.
    # Descendants that outlived the leader are still reached one by one.
    leaders = [child for child in children if child.popen.poll() is None]
    for child in leaders:
        _signal_group(child.pid, signal.SIGTERM)
    for proc in descendants:
        _signal(proc, signal.SIGTERM)
    if _wait_gone(children, descendants, timeout_s):
        for child in leaders:
            _signal_group(child.pid, signal.SIGKILL)
            child.popen.kill()
        for proc in descendants:
            _signal(proc, signal.SIGKILL)
        left = _wait_gone(children, descendants, 10.0)
        if left:
            raise RuntimeError(f"processes {left} survived SIGKILL")


def _wait_gone(children: list[ChildProcess], descendants: list[psutil.Process], timeout_s: float) -> list[int]:
    """Wait until every child has exited (reaped by its Popen, so its exit code is kept) and every
    descendant is gone; return the pids still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [c.pid for c in children if c.popen.poll() is None]
        alive += [p.pid for p in descendants if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


class ChildStartError(RuntimeError):
    """A child died or did not become healthy; the message holds the tail of its log."""


def listener_pids(port: int) -> set[int | None]:
    """The pids of the processes listening on TCP `port` (None for a socket whose owner this user
    cannot see: another user's, when not root)."""
    return {c.pid for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def require_own_listener(child: ChildProcess, url: str) -> None:
    """ChildStartError unless what listens at `url`'s port is `child` or a process it started: a process
    that took the port first (or in a restart's window) answers /health too, and must not be sent the
    run's key (the engine group verifies this before any request that carries it)."""
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"{child.name}: {url} names no port")
    try:
        ours = {child.popen.pid, *(p.pid for p in psutil.Process(child.popen.pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        ours = set()
    foreign = listener_pids(port) - ours
    if foreign or not ours:
        owner = next(iter(foreign), None)
        who = "a process this user cannot see" if owner is None else f"pid {owner} ({_process_name(owner)})"
        raise ChildStartError(f"{child.name}: port {port} is held by {who}, not by the server lean_rl started "
                              f"(pid {child.popen.pid}); nothing was sent to it: free the port or choose another")


def _process_name(pid: int) -> str:
    try:
        return " ".join(" ".join(psutil.Process(pid).cmdline()).split())[:80] or psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"


def wait_until_healthy(
    children: list[tuple[ChildProcess, str]],
    timeout_s: float,
    *,
    poll_interval_s: float = 0.5,
    fatal_log_lines: dict[str, str] | None = None,
) -> float:
    """Poll each (child, health_url) until it answers 200; return the seconds it took.

    Raises ChildStartError at once when a child exits, or when its log shows one of
    `fatal_log_lines` (text -> explanation) for a failure after which the child would hang instead of
    exiting; raises at the deadline naming the children still not ready.
    """
    start = time.monotonic()
    pending = list(children)
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False) as http:
        while pending:
            for child, url in list(pending):
                if not child.alive():
                    error = child.last_error_line()
                    raise ChildStartError(
                        f"{child.name} exited with code {child.popen.returncode} while starting"
                        + (f": {error}" if error else "")
                        + f"; last lines of {child.log_path}:\n{child.log_tail()}"
                    )
                for needle, why in (fatal_log_lines or {}).items():
                    if child.log_contains(needle):
                        raise ChildStartError(f"{child.name}: {why}; last lines of {child.log_path}:\n{child.log_tail()}")
                try:
                    healthy = http.get(url).status_code == 200
                except httpx.TransportError:
                    healthy = False  # not listening yet
                if healthy:
                    require_own_listener(child, url)  # before anyone sends it the run's key
                    pending.remove((child, url))
            if pending and time.monotonic() - start > timeout_s:
                names = ", ".join(child.name for child, _ in pending)
                tails = "\n".join(f"--- {c.log_path}:\n{c.log_tail(15)}" for c, _ in pending)
                raise ChildStartError(f"{names} not healthy after {timeout_s:.0f} s (--engine-start-timeout)\n{tails}")
            if pending:
                time.sleep(poll_interval_s)
    return time.monotonic() - start
