"""What a tool call returns (SandboxResult) and how its output is collected while it runs
(OutputCollector: the first `max_output_bytes` of stdout+stderr; past them the process group is killed,
so the parent never holds more than the cap and the child never blocks on a full pipe)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass


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


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already empty
        pass  # (its number is not reused while any member lives, so this never hits a stranger's group)


class OutputCollector(asyncio.SubprocessProtocol):
    """Keeps the first `cap` bytes of stdout+stderr, kills the group past them; notes exit and pipe closing."""

    def __init__(self, cap: int) -> None:
        self.kept = {1: bytearray(), 2: bytearray()}
        self.room, self.over_cap = cap, False
        loop = asyncio.get_running_loop()
        self.exited, self.finished = loop.create_future(), loop.create_future()
        self.pid = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)  # a SubprocessProtocol's transport
        self.pid = transport.get_pid()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = data[:self.room]
        self.kept[fd] += kept
        self.room -= len(kept)
        if len(kept) < len(data) and not self.over_cap:
            self.over_cap = True
            kill_group(self.pid)

    def send_stdin(self, transport: asyncio.SubprocessTransport, data: bytes) -> None:
        """Write the call's stdin into its pipe and close it (buffered by the loop: a child that never
        reads it only leaves it unread; one that exits first breaks the pipe, which the loop absorbs)."""
        pipe = transport.get_pipe_transport(0)
        assert isinstance(pipe, asyncio.WriteTransport)
        if data:
            pipe.write(data)
        pipe.close()

    def process_exited(self) -> None:  # the child itself; a grandchild may still hold the pipes
        self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:  # exited and every pipe closed
        self.finished.set_result(None)
