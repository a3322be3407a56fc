"""One run per directory. A run holds an exclusive flock on DIR/.lean_rl.lock for each of its
--output-dir and --save while it runs, with its pid written in; a second run on the same directory is
refused at start-up, before it touches anything (two runs on one --save would delete each other's
in-flight checkpoints). The kernel drops the lock when the holder exits, however it exits (kill -9
too), so a stale lock file never blocks a rerun."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from lean_rl.options import ConfigError

LOCK_FILE = ".lean_rl.lock"


class DirectoryLock:
    def __init__(self, directory: str | os.PathLike, flag: str):
        self.directory, self.flag = Path(directory), flag
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        """Take the lock, or a ConfigError naming the flag, the directory and the pid that holds it."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        except OSError as err:
            raise ConfigError(f"{self.flag} {self.directory}: cannot create its lock file ({err.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(f"{self.flag} {self.directory}: in use by another run (pid {holder}); give this run its "
                              "own directory, or wait for that one to end") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def lock_run_directories(output_dir: str, save: str | None) -> list[DirectoryLock]:
    """The locks of a run's --output-dir and --save (one lock where they are the same directory)."""
    locks = [DirectoryLock(output_dir, "--output-dir").acquire()]
    if save and os.path.realpath(save) != os.path.realpath(output_dir):
        try:
            locks.append(DirectoryLock(save, "--save").acquire())
        except ConfigError:
            locks[0].release()
            raise
    return locks
