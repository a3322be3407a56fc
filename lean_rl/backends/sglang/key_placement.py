"""The run's private key file, placed on every node whose processes receive the key (run_key.py).

A FileBackedKey pickles as its file's path, and the receiving process reads that path on its own
node. The file the driver writes lives in its node's temporary directory, so on a cluster without a
shared filesystem the driver first places it at the same path on each other node that an engine
actor or a trainer rank runs on: one Ray task pinned to that node (NodeAffinitySchedulingStrategy,
soft=False) writes it 0600 in a 0700 directory, and a second pinned task removes it at the run's
end or the driver's exit (best effort, with a deadline). The user's --sglang-api-key-file is never copied: that path is
theirs to provide on every node (a node that cannot read it says so, naming itself and the flag).

Why the key may be a normal task's argument when it may not be an actor's (checked in Ray 2.60's
generated protocol, ray/core/generated/*_pb2.py in the venv): an actor's creation spec, arguments
included, goes to the GCS (RegisterActorRequest.task_spec, CreateActorRequest.task_spec), which
keeps it in its ACTOR_TASK_SPEC table (gcs_pb2.TablePrefix; persisted in Redis under GCS fault
tolerance) for the actor's lifetime and restarts, and hands it out again (GetNamedActorInfoReply.
task_spec). A normal task's spec goes from its owner (the driver) to the raylet and the worker that
runs it; what reaches the GCS is its task event, TaskInfoEntry, which holds its name, resources,
node and ids but no arguments. No other GCS message carries a TaskSpec. So the key lives only in the
driver, transiently in the pinned node's raylet and worker, and in the file it writes there.
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
from typing import Iterable

from lean_rl.backends.sglang.run_key import FileBackedKey

logger = logging.getLogger(__name__)

_written: dict[str, set[str]] = {}  # path -> the node ids where this driver's task created it
_placed: set[tuple[str, str]] = set()  # (path, node id) known to hold the file


def place_key_file(key: str | None, node_ids: Iterable[str], timeout_s: float = 60.0) -> dict[str, bool]:
    """The driver's private key file of `key` at its path on each of `node_ids` (the driver's own node
    and nodes placed before excepted); per node asked now: True where written, False where it was there.
    Nothing for no key or the user's --sglang-api-key-file. RuntimeError naming the node when it fails."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not isinstance(key, FileBackedKey) or not key.private or not ray.is_initialized():
        return {}
    here = ray.get_runtime_context().get_node_id()
    todo = sorted({node for node in node_ids if node != here and (key.path, node) not in _placed})
    refs = [_write_key_task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id=node, soft=False)).remote(key.path, str(key)) for node in todo]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) != len(refs):
        late = [node for node, ref in zip(todo, refs) if ref not in ready]
        raise RuntimeError(f"the run's API key file could not be placed on node(s) {late} within {timeout_s:.0f} s")
    done: dict[str, bool] = {}
    for node, ref in zip(todo, refs):
        ran_on, written = ray.get(ref)
        if ran_on != node:
            raise RuntimeError(f"the run's API key file: its task for node {node} ran on {ran_on}")
        _placed.add((key.path, node))
        done[node] = written
        if written:
            if not _written:
                atexit.register(_remove_at_exit, os.getpid())
            _written.setdefault(key.path, set()).add(node)
    return done


def node_ids_at(addresses: Iterable[str]) -> list[str]:
    """The ids of the alive Ray nodes at `addresses` (an address no node has, e.g. an in-process
    group's 127.0.0.1, is this node's: left out)."""
    import ray

    if not ray.is_initialized():
        return []
    wanted = set(addresses)
    return [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] in wanted]


def node_ids_of_bundles(group, indices: Iterable[int] | None = None) -> list[str]:
    """The node ids a ready placement group's bundles (`indices`, or all) are on."""
    from ray.util.placement_group import placement_group_table

    on_node = placement_group_table(group)["bundles_to_node_id"]
    return [on_node[i] for i in (on_node if indices is None else indices) if on_node.get(i)]


def all_node_ids() -> list[str]:
    import ray

    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def remove_placed_key_files(timeout_s: float = 10.0) -> None:
    """Remove the files this driver placed, one pinned task per node, waiting at most `timeout_s` in
    all: at the run's end, before Ray's shutdown (runtime.py), and at exit for whatever is left
    (atexit runs it before Ray's own shutdown, registered earlier by ray.init). Best effort."""
    import ray

    if not _written or not ray.is_initialized():
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        refs = [_remove_key_task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id=node, soft=False)).remote(path) for path, nodes in _written.items() for node in nodes]
        ready, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if late:
            logger.warning("the run's API key file: %d node(s) did not confirm its removal in %.0f s",
                           len(late), timeout_s)
    except Exception as error:  # noqa: BLE001 - best effort at the end: a node may be gone
        logger.warning("the run's API key file: removal on the other nodes failed: %s", error)
    _written.clear()
    _placed.clear()


def _remove_at_exit(owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not from a forked child that runs atexit handlers
        remove_placed_key_files()


def write_key_here(path: str, key: str) -> bool:
    """`key` in a new 0600 file `path` in a 0700 directory (both created, never through a link):
    True; False when `path` already is such a file of ours with that key; RuntimeError otherwise."""
    directory = os.path.dirname(path)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise RuntimeError(f"{directory}: exists and is not a private directory of this user") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as f:
            info = os.fstat(f.fileno())
            if info.st_uid == os.getuid() and not stat.S_IMODE(info.st_mode) & 0o077 and f.readline().strip() == key:
                return False
        raise RuntimeError(f"{path}: exists, with another key or permissions open to others") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return True


def _write_key(path: str, key: str) -> tuple[str, bool]:
    import ray

    node = ray.get_runtime_context().get_node_id()
    try:
        return node, write_key_here(path, key)
    except OSError as error:
        raise RuntimeError(f"the run's API key file {path} on node {node}: {error.strerror}") from None


def _remove_key(path: str) -> None:
    try:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


class _LazyTask:
    """A Ray remote function made on first use (importing this module does not import Ray)."""

    def __init__(self, fn):
        self.fn, self._task = fn, None

    def options(self, **options):
        if self._task is None:
            import ray

            self._task = ray.remote(self.fn)
        return self._task.options(**options)


_write_key_task = _LazyTask(_write_key)
_remove_key_task = _LazyTask(_remove_key)
