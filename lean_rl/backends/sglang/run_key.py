"""How the run's API key lives and travels: in a file only its owner can read, never in a pickle.

The driver reads the key once (config.resolve_api_key: the flag, the file, or $LEAN_RL_API_KEY, which
it then removes from its own environment, so that Ray, the router and every other child start
without it) and holds it as a FileBackedKey: a str that knows the path of its file (mode 0600 in a
0700 directory of its own, or the user's --sglang-api-key-file). Pickled (an EngineConfig as an
engine actor's argument, a RankSyncPlan sent to the trainer ranks) a FileBackedKey is that path;
unpickling reads the file again in the process that needs the key. So no Ray argument, object or
task spec (kept in Ray's GCS) holds the key, and only processes that call or serve an engine read it.
On a cluster the receiving process reads the path on its own node: the file the driver writes is
placed at the same path on the other nodes first (key_placement.py); --sglang-api-key-file is the
user's to provide at a path every node can read (a node that cannot read it names itself and the flag).

A key file someone other than its owner may read or write is refused, as ssh refuses such a private
key: "permissions 0644 for 'F' are too open".
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import stat
import tempfile

from lean_rl.options import ConfigError

KEY_FILE_NAME = "api_key"


class FileBackedKey(str):
    """The run's key together with the path of the private file that holds it; pickles as that path."""

    path: str
    private: bool  # the file this driver wrote (placed on other nodes), not the user's --sglang-api-key-file

    def __new__(cls, key: str, path: str, private: bool = False) -> FileBackedKey:
        obj = super().__new__(cls, key)
        obj.path = path
        obj.private = private
        return obj

    def __reduce__(self):
        return load_key_file, (self.path, self.private)

    def __copy__(self) -> FileBackedKey:
        return self

    def __deepcopy__(self, memo: dict) -> FileBackedKey:
        return self


def read_private_first_line(path: str, what: str) -> str:
    """The first line (stripped) of `path`, a file only its owner may read: ConfigError naming `what`
    and the file when it cannot be read, is not text, or grants group/other any access."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)  # of the file opened, not of a later one
            if mode & 0o077:
                raise ConfigError(f"{what}: permissions {mode:04o} for '{path}' are too open: the key must "
                                  f"be readable by its owner only (chmod 600 '{path}')")
            return f.readline().strip()
    except OSError as err:
        raise ConfigError(f"{what}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: not a text file") from None


def load_key_file(path: str, private: bool = False) -> FileBackedKey:
    """The key a FileBackedKey pickled as `path` (what unpickling calls, in the receiving process);
    an error names this node, and the flag when the file is the user's."""
    what = f"the run's API key file {path}" if private else f"--sglang-api-key-file {path}"
    what += f" (on node {_this_node()})"
    key = read_private_first_line(path, what)
    if not key:
        raise ConfigError(f"{what}: it is empty")
    return FileBackedKey(key, path, private)


def _this_node() -> str:
    """This process's Ray node address, else its host name (for errors)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - only for a message
        pass
    return socket.gethostname()


def write_key_file(key: str) -> FileBackedKey:
    """`key` written to a new 0600 file in a new 0700 directory of the temporary directory, removed
    when this process exits; the key, backed by that file."""
    directory = tempfile.mkdtemp(prefix="lean_rl_key_")
    path = os.path.join(directory, KEY_FILE_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    atexit.register(_remove_key_dir, directory, os.getpid())
    return FileBackedKey(key, path, private=True)


def _remove_key_dir(directory: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not from a forked child that runs atexit handlers
        shutil.rmtree(directory, ignore_errors=True)
