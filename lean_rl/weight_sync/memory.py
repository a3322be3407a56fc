"""Colocated engines on GPU give their memory to the trainer while it trains.

    memory.release()                 # before training: weights, KV cache, CUDA graphs
    memory.resume(WEIGHTS)           # before a weight sync: room for the new weights only
    memory.resume(KV_CACHE_AND_GRAPHS)  # after it: ready to generate

SGLang frees and restores these with /release_memory_occupation and /resume_memory_occupation
(tags as in sglang/srt/constants.py GPU_MEMORY_TYPE_*; the server needs --enable-memory-saver). On CPU
both endpoints are no-ops and --enable-memory-saver cannot even start (it loads libcuda), so every
step here is skipped by an explicit device check: the engines' own device, from /server_info.
"""

from __future__ import annotations

from typing import Sequence

from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.engine_calls import call_all

WEIGHTS = ("weights",)
KV_CACHE_AND_GRAPHS = ("kv_cache", "cuda_graph")
ALL = (*WEIGHTS, *KV_CACHE_AND_GRAPHS)


class EngineMemory:
    """What each engine has released, by URL, in `released`: a dict the caller may keep across
    WeightSyncs (EngineWeights does: the run's WeightSync is rebuilt after an engine restart, and the
    engines that did not restart are still released then, review M5). A restarted engine starts with
    everything in place: its entry must be dropped (EngineWeights.forget_restarted)."""

    def __init__(self, clients: Sequence, engine_device: str, timeout_s: float,
                 released: dict[str, set[str]] | None = None):
        self.clients = list(clients)
        self.enabled = engine_device == "cuda"  # the explicit device check
        self.timeout_s = timeout_s
        self.released: dict[str, set[str]] = {} if released is None else released

    def release(self, tags: Sequence[str] = ALL) -> bool:
        """Free `tags` on every engine; False when skipped (CPU engines). The engines must be idle."""
        if not self.enabled:
            return False
        # per engine only what it still holds (SGLang refuses to release a tag twice); engines with the
        # same tags to release are called together
        for todo, clients in self._by_tags(tags, lambda held, tag: tag not in held).items():
            call_all(clients, self.timeout_s, EngineClient.release_memory_occupation, list(todo))
            for client in clients:
                self.released.setdefault(client.base_url, set()).update(todo)
        return True

    def holds_released(self, tags: Sequence[str]) -> bool:
        """Some engine has released one of `tags` (resume would call it)."""
        return self.enabled and bool(self._by_tags(tags, lambda held, tag: tag in held))

    def resume(self, tags: Sequence[str]) -> bool:
        """Restore, on each engine, those of `tags` it released; False when nothing was to do."""
        if not self.enabled:
            return False
        # resuming a tag that was not released raises in SGLang (offload_tags.remove)
        groups = self._by_tags(tags, lambda held, tag: tag in held)
        for todo, clients in groups.items():
            call_all(clients, self.timeout_s, EngineClient.resume_memory_occupation, list(todo))
            for client in clients:
                self.released[client.base_url].difference_update(todo)
        return bool(groups)

    def _by_tags(self, tags: Sequence[str], wanted) -> dict[tuple[str, ...], list]:
        """{tags to act on: the engines that need exactly those}, engines with none left out."""
        groups: dict[tuple[str, ...], list] = {}
        for client in self.clients:
            held = self.released.get(client.base_url, set())
            todo = tuple(tag for tag in tags if wanted(held, tag))
            if todo:
                groups.setdefault(todo, []).append(client)
        return groups
