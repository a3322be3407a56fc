"""What the pinned task does on its node (key_placement.write_key_here) and what a node that cannot
read the key's file says (run_key.load_key_file); placement itself: tests/integration/test_key_placement.py."""

import os
import pickle
import re
import socket
import stat

import pytest

from lean_rl.backends.sglang.key_placement import write_key_here
from lean_rl.backends.sglang.run_key import FileBackedKey
from lean_rl.options import ConfigError


def test_a_new_file_is_0600_in_a_0700_directory_and_an_identical_one_is_left(tmp_path):
    path = tmp_path / "d" / "api_key"
    assert write_key_here(str(path), "k") is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == "k\n"
    assert write_key_here(str(path), "k") is False


def test_another_key_an_open_file_a_link_or_an_open_directory_are_refused(tmp_path):
    path = tmp_path / "d" / "api_key"
    write_key_here(str(path), "k")
    with pytest.raises(RuntimeError, match="another key"):
        write_key_here(str(path), "other")
    path.chmod(0o644)
    with pytest.raises(RuntimeError, match="permissions"):
        write_key_here(str(path), "k")
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):  # O_NOFOLLOW: never written through a link
        write_key_here(str(path), "k")
    assert not (tmp_path / "elsewhere").exists()
    os.mkdir(tmp_path / "open", 0o755)
    with pytest.raises(RuntimeError, match="not a private directory"):
        write_key_here(str(tmp_path / "open" / "api_key"), "k")


def test_a_node_that_cannot_read_the_users_key_file_names_itself_and_the_flag(tmp_path):
    user = pickle.dumps(FileBackedKey("k", str(tmp_path / "absent")))
    with pytest.raises(ConfigError) as error:
        pickle.loads(user)
    message = str(error.value)
    # the node: its Ray address where this process is in a Ray cluster (as in the suite), else its host name
    assert re.match(rf"--sglang-api-key-file {re.escape(str(tmp_path / 'absent'))} \(on node [^)\s]+\): cannot read it",
                    message), message
    assert "\n" not in message
    private = pickle.dumps(FileBackedKey("k", str(tmp_path / "absent"), private=True))
    with pytest.raises(ConfigError, match=r"the run's API key file .* \(on node "):
        pickle.loads(private)
