"""The trainer's side of SGLang's weight-update process group (/init_weights_update_group).

Each engine joins with sglang/srt/utils/common.py:2859 `init_custom_process_group`: a tcp://
rendezvous on master_address:master_port, a PrefixStore(group_name) over it, and a group of its own
outside the engine's default world (rank = rank_offset + its TP rank). The trainer is rank 0 and
hosts the store, on its own utils.net.service_host (127.0.0.1 on one node, the stage lead's node
address on a cluster), and the engines are told that address. torch's TCPStore binds every interface
when it opens the port itself, so the store is opened on a socket bound to that address only
(distributed.open_rendezvous_store), then the group is built
the same way SGLang builds it (backends.sglang.compat.join_weight_update_group: the torch-private
steps of SGLang's recipe live there).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Sequence

import torch
import torch.distributed as dist

from lean_rl.backends.megatron.distributed import open_rendezvous_store
from lean_rl.backends.sglang.compat import join_weight_update_group
from lean_rl.utils.net import LOOPBACK
from lean_rl.weight_sync.errors import WeightSyncError

_POLL_S = 0.0002  # while a broadcast runs: how often to look at the engines' HTTP calls


def open_group_store(world_size: int, timeout_s: float, host: str = LOOPBACK) -> tuple[dist.TCPStore, int]:
    """A rendezvous store on `host` for `world_size` members; returns (store, port)."""
    return open_rendezvous_store(world_size, timeout_s, host)


def join_as_rank_zero(store: dist.Store, world_size: int, group_name: str, backend: str,
                      timeout_s: float) -> dist.ProcessGroup:
    """Build the group as rank 0; blocks until every engine rank has joined (or the timeout)."""
    return join_group(store, world_size, 0, group_name, backend, timeout_s)


def join_group(store: dist.Store, world_size: int, rank: int, group_name: str, backend: str,
               timeout_s: float) -> dist.ProcessGroup:
    """Any member's side of the recipe (rank 0 is the trainer; the bench's floor uses the others)."""
    return join_weight_update_group(store, world_size, rank, group_name, backend, timeout_s)


def broadcast_to_engines(pg: dist.ProcessGroup, tensors: Sequence[torch.Tensor],
                         calls: Sequence[tuple[str, Future]], timeout_s: float, what: str) -> None:
    """Broadcast `tensors` from rank 0, in order, while the engines' HTTP calls (which make them
    receive them) are in flight. All broadcasts are queued at once (both sides issue them in order),
    so there is no round trip between tensors. Fails fast when one of those calls fails (the engine
    will never join the broadcast) or when the deadline passes; after a failure the group is unusable
    (its broadcasts stay pending)."""
    stream = BroadcastStream(pg, calls, timeout_s, what)
    for tensor in tensors:
        stream.send(tensor)
    stream.finish()


class BroadcastStream:
    """Broadcasts from rank 0 queued one tensor at a time while the engines' HTTP calls for them are
    in flight: the caller may go on producing the next tensor (the stage's export) while gloo / NCCL
    sends the ones queued, so export and transfer overlap. Each tensor is kept alive until `finish`
    has seen its broadcast complete."""

    def __init__(self, pg: dist.ProcessGroup, calls: Sequence[tuple[str, Future]], timeout_s: float, what: str):
        self.pg, self.calls, self.timeout_s, self.what = pg, calls, timeout_s, what
        self.deadline = time.monotonic() + timeout_s
        self.works: list = []
        self.tensors: list[torch.Tensor] = []

    def send(self, tensor: torch.Tensor) -> None:
        self._raise_if_a_call_failed()
        self.works.append(dist.broadcast(tensor, group=self.pg, group_src=0, async_op=True))
        self.tensors.append(tensor)

    def finish(self) -> None:
        """Return once every queued broadcast completed; WeightSyncError when an engine's call failed
        first (it will never receive them) or the deadline passed."""
        done = 0  # gloo may run queued collectives on several threads: watch each, not just the last
        while True:
            while done < len(self.works) and self.works[done].is_completed():
                done += 1
            if done == len(self.works):
                break
            self._raise_if_a_call_failed()
            if time.monotonic() > self.deadline:
                raise WeightSyncError(f"{self.what}: broadcast not received by every engine within "
                                      f"{self.timeout_s:.0f}s (engines: {', '.join(url for url, _ in self.calls)})")
            time.sleep(_POLL_S)
        for work in self.works:
            work.wait()  # raises the backend's error, if any
        self.works, self.tensors = [], []

    def _raise_if_a_call_failed(self) -> None:
        for url, future in self.calls:
            if future.done() and future.exception() is not None:
                raise WeightSyncError(f"{self.what}: {url} failed before receiving the broadcast: "
                                      f"{future.exception()}") from future.exception()


def abort_group(pg: dist.ProcessGroup | None) -> bool:
    """After a failed broadcast (an engine died mid-sync): abort an NCCL group at once, so that its
    pending collectives end now. Left alone, ProcessGroupNCCL's watchdog tears the whole trainer
    process down once they pass the group's timeout (review W1). A gloo group has no abort: its
    pending work only stays pending, and the group is dropped (never destroyed: that could wait on
    it). Returns whether the group was aborted."""
    try:
        if pg is None or dist.get_backend(pg) != "nccl":
            return False
    except (ValueError, RuntimeError):  # not a group torch knows (any more): nothing to abort
        return False
    dist.distributed_c10d._abort_process_group(pg)  # torch's API for this; NCCL only
    return True
