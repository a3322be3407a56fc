"""Which sampler snapshots (LoRA adapters) the engines hold: at most `capacity`, the least recently
sampled unloaded first. Least recently *sampled*, not oldest: a DPO or KL reference client made at the
start samples at every step and must outlive the evaluation snapshots saved after it."""

from __future__ import annotations


class SnapshotSlots:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._order: list[str] = []  # least recently used first

    def __contains__(self, name: str) -> bool:
        return name in self._order

    def touch(self, name: str) -> None:
        """`name` was sampled: it is now the last to go."""
        if name in self._order:
            self.add(name)

    def make_room(self) -> list[str]:
        """The snapshots to unload (least recently used first) so that one more fits."""
        evicted = []
        while len(self._order) >= self.capacity:
            evicted.append(self._order.pop(0))
        return evicted

    def add(self, name: str) -> None:
        if name in self._order:
            self._order.remove(name)
        self._order.append(name)
