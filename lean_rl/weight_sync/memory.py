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

from lean_rl.weight_sync.engine_calls import call_all

WEIGHTS = ("weights",)
KV_CACHE_AND_GRAPHS = ("kv_cache", "cuda_graph")
ALL = (*WEIGHTS, *KV_CACHE_AND_GRAPHS)


class EngineMemory:
    def __init__(self, clients: Sequence, engine_device: str, timeout_s: float):
        self.clients = list(clients)
        self.enabled = engine_device == "cuda"  # the explicit device check
        self.timeout_s = timeout_s
        self.released: set[str] = set()

    def release(self, tags: Sequence[str] = ALL) -> bool:
        """Free `tags` on every engine; False when skipped (CPU engines). The engines must be idle."""
        if not self.enabled:
            return False
        call_all(self.clients, self.timeout_s, "release_memory_occupation", list(tags))
        self.released.update(tags)
        return True

    def resume(self, tags: Sequence[str]) -> bool:
        """Restore those of `tags` that were released; False when nothing was to do."""
        todo = [tag for tag in tags if tag in self.released]
        if not self.enabled or not todo:
            return False
        call_all(self.clients, self.timeout_s, "resume_memory_occupation", todo)
        self.released.difference_update(todo)
        return True
