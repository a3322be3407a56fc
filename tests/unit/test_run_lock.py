"""lean_rl/run_lock.py across real processes: a held directory is refused with the holder's pid, and
the lock goes with its holder however it ends (kill -9 included)."""

import signal
import subprocess
import sys

import pytest

from lean_rl.options import ConfigError
from lean_rl.run_lock import DirectoryLock, lock_run_directories

HOLD = """
import sys, time
from lean_rl.run_lock import DirectoryLock
DirectoryLock(sys.argv[1], "--save").acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_held_directory_is_refused_until_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "ckpt")], text=True, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"--save {tmp_path / 'ckpt'}: in use by another run \(pid {holder.pid}\)"):
            DirectoryLock(tmp_path / "ckpt", "--save").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    lock = DirectoryLock(tmp_path / "ckpt", "--save").acquire()  # the kernel dropped the dead holder's lock
    lock.release()


def test_output_dir_and_save_are_both_held_and_released(tmp_path):
    locks = lock_run_directories(str(tmp_path / "out"), str(tmp_path / "save"))
    with pytest.raises(ConfigError, match="--save"):
        DirectoryLock(tmp_path / "save", "--save").acquire()
    for lock in locks:
        lock.release()
    [same] = lock_run_directories(str(tmp_path / "same"), str(tmp_path / "same"))
    same.release()
