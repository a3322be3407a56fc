"""BlockingEngineClient: the async EngineClient (client.py) run on a private event-loop thread (an anyio
blocking portal), for ordinary code such as the trainer driver's weight sync. Each EngineClient method is
here as a blocking call of the same name; submit(fn, ...) returns a concurrent.futures.Future instead,
which is what update_weights_from_distributed needs: the HTTP call must be in flight while the trainer
broadcasts the tensors."""

from __future__ import annotations

import functools
from concurrent.futures import Future
from typing import Callable

from lean_rl.backends.sglang.client import EngineClient


class BlockingEngineClient:
    """EngineClient's API as blocking calls, run on a private event-loop thread. Close it (or use it
    as a context manager) to stop that thread."""

    def __init__(self, base_url: str, **client_kwargs):
        from anyio.from_thread import start_blocking_portal

        self.client = EngineClient(base_url, **client_kwargs)
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @property
    def portal(self):
        if self._portal is None:
            raise RuntimeError(f"BlockingEngineClient({self.base_url}) is closed")
        return self._portal

    def submit(self, fn: Callable, *args, **kwargs) -> Future:
        """Start `fn(client, *args, **kwargs)` (`fn` an EngineClient method by reference, e.g.
        EngineClient.score) and return at once with its Future."""
        return self.portal.start_task_soon(functools.partial(fn, self.client, *args, **kwargs))

    def close(self) -> None:
        if self._portal is not None:
            self._portal.call(self.client.aclose)
            self._portal_cm.__exit__(None, None, None)
            self._portal = None

    def __enter__(self) -> BlockingEngineClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _blocking(name: str):
    async_method = getattr(EngineClient, name)

    @functools.wraps(async_method)
    def call(self: BlockingEngineClient, *args, **kwargs):
        return self.portal.call(functools.partial(getattr(self.client, name), *args, **kwargs))

    return call


for _name in (
    "generate", "score", "abort_request", "pause_generation", "continue_generation", "flush_cache",
    "update_weights_from_disk", "begin_weight_update", "end_weight_update", "update_weights_from_tensor",
    "update_weights_from_distributed", "replace_lora_adapter", "init_weights_update_group", "destroy_weights_update_group",
    "health", "is_healthy", "model_info", "server_info", "weight_version", "loads",
    "weight_checksums", "release_memory_occupation", "resume_memory_occupation",
):
    setattr(BlockingEngineClient, _name, _blocking(_name))
