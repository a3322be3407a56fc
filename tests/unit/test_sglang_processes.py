"""Process-tree handling with small real Python processes (the SGLang version is in tests/integration)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from lean_rl.backends.sglang.processes import ChildProcess, ChildStartError, stop_all, wait_until_healthy
from lean_rl.utils.net import find_free_port

# Ignores SIGTERM, starts a grandchild in its group and one in a session of its own, prints their pids.
STUBBORN_TREE = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    same_group = subprocess.Popen([sys.executable, "-c", ignore])
    own_session = subprocess.Popen([sys.executable, "-c", ignore], start_new_session=True)
    print("PIDS", same_group.pid, own_session.pid, flush=True)
    time.sleep(600)
""")


def wait_for_line(child: ChildProcess, prefix: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in child.log_tail(50).splitlines():
            if line.startswith(prefix):
                return line
        time.sleep(0.05)
    raise AssertionError(f"{prefix!r} never appeared in {child.log_path}:\n{child.log_tail()}")


def test_stop_kills_a_tree_that_ignores_sigterm(tmp_path):
    child = ChildProcess("stubborn", [sys.executable, "-c", STUBBORN_TREE], tmp_path / "stubborn.log")
    grandchildren = [int(p) for p in wait_for_line(child, "PIDS").split()[1:]]
    assert set(grandchildren) <= set(child.tree_pids())
    start = time.monotonic()
    stop_all([child], timeout_s=1.0)
    assert time.monotonic() - start < 10
    for pid in [child.pid, *grandchildren]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert child.tree_pids() == []
    assert child.popen.returncode == -signal.SIGKILL
    stop_all([child], timeout_s=1.0)  # a second stop is harmless


def test_child_runs_in_its_own_session_and_logs_to_its_file(tmp_path):
    child = ChildProcess("echo", [sys.executable, "-c", "print('hello from the child')"], tmp_path / "logs" / "echo.log")
    child.popen.wait(timeout=30)
    assert "hello from the child" in child.log_tail()
    assert child.log_tail().startswith("$ ")  # the command line heads the log
    child = ChildProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "sleeper.log")
    try:
        assert os.getpgid(child.pid) == child.pid and os.getsid(child.pid) == child.pid
    finally:
        child.stop(timeout_s=5)


def test_a_child_that_dies_while_starting_is_reported_with_its_log_tail(tmp_path):
    script = "import sys; print('loading'); print('OSError: disk on fire', file=sys.stderr); print('bye'); exit(3)"
    child = ChildProcess("dies", [sys.executable, "-c", script], tmp_path / "dies.log")
    url = f"http://127.0.0.1:{find_free_port()}/health"
    with pytest.raises(ChildStartError, match=r"(?s)dies exited with code 3 while starting: OSError: disk on fire; "
                                              r"last lines of .*dies.log:.*loading.*bye"):
        wait_until_healthy([(child, url)], timeout_s=60, poll_interval_s=0.05)


def test_a_child_that_never_gets_healthy_times_out(tmp_path):
    child = ChildProcess("silent", [sys.executable, "-c", "print('still importing'); import time; time.sleep(60)"],
                         tmp_path / "silent.log")
    try:
        url = f"http://127.0.0.1:{find_free_port()}/health"
        start = time.monotonic()
        with pytest.raises(ChildStartError, match=r"(?s)silent not healthy after 1 s.*still importing"):
            wait_until_healthy([(child, url)], timeout_s=1.0, poll_interval_s=0.05)
        assert time.monotonic() - start < 10
    finally:
        child.stop(timeout_s=5)


def test_a_fatal_log_line_fails_fast_instead_of_waiting_for_a_hung_child(tmp_path):
    script = "print('ERROR: error while attempting to bind on address', flush=True); import time; time.sleep(60)"
    child = ChildProcess("hung", [sys.executable, "-c", script], tmp_path / "hung.log")
    try:
        url = f"http://127.0.0.1:{find_free_port()}/health"
        start = time.monotonic()
        with pytest.raises(ChildStartError, match="hung: port taken"):
            wait_until_healthy([(child, url)], timeout_s=60, poll_interval_s=0.05,
                               fatal_log_lines={"error while attempting to bind on address": "port taken"})
        assert time.monotonic() - start < 10
    finally:
        child.stop(timeout_s=5)


PARENT_THAT_GETS_KILLED = textwrap.dedent("""
    import sys, time
    from lean_rl.backends.sglang.processes import ChildProcess
    child = ChildProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], sys.argv[1])
    print("CHILD", child.pid, flush=True)
    time.sleep(600)
""")


def test_children_die_when_the_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT_THAT_GETS_KILLED, str(tmp_path / "sleeper.log")],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.startswith("CHILD"), line
        child_pid = int(line.split()[1])
        assert psutil.pid_exists(child_pid)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child_pid) and psutil.Process(child_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"child {child_pid} outlived its killed parent"
        time.sleep(0.05)


def test_a_restarted_child_sees_only_its_own_part_of_the_shared_log(tmp_path):
    log = tmp_path / "engine-0.log"
    first = ChildProcess("first", [sys.executable, "-c", "print('ValueError: first run failed')"], log)
    first.popen.wait(timeout=30)
    second = ChildProcess("second", [sys.executable, "-c", "print('second run ok')"], log)
    second.popen.wait(timeout=30)
    assert "first run failed" in log.read_text()  # the file keeps both runs
    assert not second.log_contains("first run failed")
    assert second.last_error_line() is None
    assert second.log_tail().startswith("$ ") and "second run ok" in second.log_tail()


IMPOSTOR = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            print("GOT", self.path, self.headers.get("Authorization"), flush=True)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
""")


def test_a_port_taken_by_another_process_is_refused_before_any_key_is_sent(tmp_path):
    """A process that grabbed the server's port answers /health like the server would: the health wait
    names it and stops, and it never sees a request with the key."""
    port = find_free_port()
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(port)], stdout=subprocess.PIPE, text=True)
    ours = ChildProcess("engine-0", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "e.log")
    try:
        deadline = time.monotonic() + 30
        while port not in {c.laddr.port for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN}:
            assert time.monotonic() < deadline, "the impostor never listened"
            time.sleep(0.1)
        with pytest.raises(ChildStartError, match=rf"engine-0: port {port} is held by pid {impostor.pid} .*nothing "
                                                  "was sent to it"):
            wait_until_healthy([(ours, f"http://127.0.0.1:{port}/health")], timeout_s=30)
    finally:
        stop_all([ours])
        impostor.kill()
    seen = impostor.communicate(timeout=30)[0].splitlines()
    assert seen == ["GOT /health None"]  # the health probe only: no key ever reached it


def test_our_own_listener_passes(tmp_path):
    port = find_free_port()
    ours = ChildProcess("engine-0", [sys.executable, "-c", IMPOSTOR, str(port)], tmp_path / "e.log")
    try:
        wait_until_healthy([(ours, f"http://127.0.0.1:{port}/health")], timeout_s=30)
    finally:
        stop_all([ours])
