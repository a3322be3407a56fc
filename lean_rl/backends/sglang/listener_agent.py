"""The listener check of listener_proc.py for a server on another node of the run's Ray cluster, done
on that node by an actor of the run, before every request that would carry the key.

The /proc check proves what holds a listening socket, and /proc exists only on the socket's node. For
a listener at the address of another Ray node, the client asks the ListenerAgent pinned to that node
(NodeAffinitySchedulingStrategy, soft=False) to run the same check there and sends the key only when
it answers "ours". The question and the answer travel over Ray's own channel (its token
authentication), never to the port being checked, so what squats on a freed port cannot answer for
itself; the node is found by its address in Ray's node table, not by asking the address.

Considered and not chosen: a challenge-response the listener proves (an HMAC of a client nonce) would
need the server to answer it, and SGLang and sglang-router are not ours to change; a responder of our
own beside the server proves only itself, not what holds the server's port.

One agent per (node, key): the name holds an HMAC of the key (so the agent checks for the very key the
client would send), in the run's Ray namespace. The driver starts the agents of its engines' nodes
(engines.EngineGroup.start, so that it owns them); any other process that needs one finds it by name or
starts it (get_if_exists). The agent reads the key from its file on its node (FileBackedKey pickles as
the path: the key is in no actor argument). No answer within the deadline, a dead agent or node, an
address no alive node has: the request fails as a connection error and the key is not sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import sys
import threading
import time
from typing import Any

from lean_rl.backends.sglang.listener_proc import ForeignListenerError

_NAME = "lean_rl_listener_agent"
_ANSWER_S = 30.0  # an agent's start (first use on a node) included; no wait without a deadline
_NODES_FRESH_S = 5.0  # an address not in the node table is looked up again after this long

_lock = threading.Lock()
_agents: dict[tuple[str, str], Any] = {}  # (node id, key name) -> actor handle
_nodes: dict[str, str] = {}  # node address -> node id, alive nodes
_nodes_read_at = -1e9


class ListenerAgent:
    """Ray actor on one node: answers whether what listens on (ip, port) there was started with the key."""

    def __init__(self, key: str):
        import ray

        self._key = key  # a FileBackedKey's file, read on this node by unpickling
        self._node_ip = ray.util.get_node_ip_address()

    def verify(self, ip: str, port: int) -> str | None:
        """None when (ip, port) on this node is held by a process started with the key; else why not."""
        from lean_rl.backends.sglang import listener_proc

        if not listener_proc.is_local(ip):
            return f"{ip} is not an address of node {self._node_ip}: the key was not sent"
        try:
            listener_proc.require_local_keyed_listener(ip, port, self._key)
        except ForeignListenerError as exc:
            return f"{exc} (checked on node {self._node_ip})"
        return None


def remote_node_of(ip: str) -> str | None:
    """The Ray node id whose address is `ip`, when this process is in a Ray cluster and `ip` is the
    address of one of its other nodes; None otherwise (this node, or no Ray here)."""
    if "ray" not in sys.modules:  # not in a Ray process: a run without Ray has one node
        return None
    import ray

    if not ray.is_initialized() or ip == ray.util.get_node_ip_address():
        return None
    global _nodes_read_at
    with _lock:
        if ip not in _nodes and time.monotonic() - _nodes_read_at > _NODES_FRESH_S:
            _nodes.clear()
            _nodes.update({n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]})
            _nodes_read_at = time.monotonic()
        return _nodes.get(ip)


def _key_name(key: str) -> str:
    return hmac.new(key.encode(), b"lean_rl listener agent", hashlib.sha256).hexdigest()[:16]


def _agent(node_id: str, key: str) -> Any:
    """The agent of (node, key): this process's handle, else the one named so, else a new one."""
    from lean_rl.backends.sglang.run_key import FileBackedKey

    if not isinstance(key, FileBackedKey):
        raise ForeignListenerError("a listener on another node can be verified only with a key that has its file "
                                   "(run_key.FileBackedKey): the key was not sent")
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"{_NAME}-{node_id[:16]}-{_key_name(key)}"
    with _lock:
        if (node_id, name) not in _agents:
            _agents[(node_id, name)] = ray.remote(ListenerAgent).options(
                name=name, get_if_exists=True, num_cpus=0, max_concurrency=16, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(key)
        return _agents[(node_id, name)]


def start_agents(key: str | None, node_ids: list[str]) -> None:
    """The agents of `node_ids` (this node excepted) started now by this process, which owns them;
    nothing without a key or Ray. RuntimeError naming the node when one does not answer in time."""
    if not key or "ray" not in sys.modules:
        return
    import ray

    if not ray.is_initialized():
        return
    here = ray.get_runtime_context().get_node_id()
    others = sorted(set(node_ids) - {here})
    if not others:  # one node: its listeners are checked in /proc here
        return
    refs = [_agent(node, key).verify.remote("", 0) for node in others]  # any answer: the agent is up
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_ANSWER_S)
    late = [node for node, ref in zip(others, refs) if ref not in ready]
    if late:
        raise RuntimeError(f"lean_rl's listener agent did not start on node(s) {late} within {_ANSWER_S:.0f} s")
    for node, ref in zip(others, refs):
        try:
            ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the node is named, the cause kept
            raise RuntimeError(f"lean_rl's listener agent could not start on node {node}: {exc}") from exc


def _forget(node_id: str) -> None:
    with _lock:
        for known in [k for k in _agents if k[0] == node_id]:
            del _agents[known]


def _no_answer(node_id: str, ip: str, port: int, exc: Exception) -> ForeignListenerError:
    """The agent gave no answer (dead, unreachable, past its deadline): forgotten, and the request fails
    as to a dead server."""
    _forget(node_id)
    return ForeignListenerError(f"{ip}:{port}: lean_rl's listener agent on node {node_id[:16]} gave no answer "
                                f"({type(exc).__name__}): the key was not sent")


def require_remote(node_id: str, ip: str, port: int, key: str) -> None:
    """Return when the agent on `node_id` finds (ip, port) held by a process of the run; else
    ForeignListenerError (its answer, or why there is none)."""
    import ray

    try:
        answer = ray.get(_agent(node_id, key).verify.remote(ip, port), timeout=_ANSWER_S)
    except ForeignListenerError:
        raise
    except Exception as exc:  # noqa: BLE001 - no answer: as a dead server, the key not sent
        raise _no_answer(node_id, ip, port, exc) from None
    if answer is not None:
        raise ForeignListenerError(answer)


async def require_remote_async(node_id: str, ip: str, port: int, key: str) -> None:
    """require_remote for an event loop: awaits the agent's answer instead of blocking the loop."""
    try:
        ref = _agent(node_id, key).verify.remote(ip, port)
        answer = await asyncio.wait_for(asyncio.wrap_future(ref.future()), _ANSWER_S)
    except ForeignListenerError:
        raise
    except Exception as exc:  # noqa: BLE001 - no answer: as a dead server, the key not sent
        raise _no_answer(node_id, ip, port, exc) from None
    if answer is not None:
        raise ForeignListenerError(answer)
