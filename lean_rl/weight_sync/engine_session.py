"""The /begin_weight_update ... /end_weight_update session the streamed transports (distributed, tensor)
send their buckets in, held by the stage leads themselves rather than by the driver.

SGLang 0.5.23 refuses a tensor or distributed update outside a session
(managers/scheduler_components/weight_updater.py:192 and :234), a second begin while one is open (:311),
and an end without one (:325); end also finalizes the weights (post-load processing of quantized
layers, model_runner_components/weight_updater.py:317), so neither call can be skipped or merged
into the update. What can go is the waiting around them: the first stage's lead posts begin to
every engine at once and goes on exporting while it is in flight (the first bucket's export hides
it), waits for it only before its first update call, and the final stage's lead posts end right
after the answer to its last bucket's call, inside the same Ray call. The driver's sync is then one
Ray call per stage, and each engine sees begin, updates, end back to back from one client.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Sequence

from lean_rl.backends.sglang.blocking_client import BlockingEngineClient
from lean_rl.backends.sglang.client import EngineClient
from lean_rl.weight_sync.engine_calls import call_all, submit_all
from lean_rl.weight_sync.errors import WeightSyncError


class EngineSession:
    """One stage lead's view of the session on every engine (its own clients, one per engine)."""

    def __init__(self, clients: Sequence[BlockingEngineClient], timeout_s: float):
        self.clients, self.timeout_s = list(clients), timeout_s
        self._begins: list[tuple[str, Future]] | None = None
        self.opened: list[BlockingEngineClient] = []  # the engines whose session is open (to end)

    def begin(self) -> None:
        """Post begin to every engine and return at once (wait_open waits for the answers)."""
        self._begins = submit_all(self.clients, EngineClient.begin_weight_update)

    def adopt(self) -> None:
        """A later pipeline stage: the first stage's lead opened every engine's session (or failed, and
        then the driver stopped before this stage)."""
        self.opened = list(self.clients)

    def answered(self) -> bool:
        """Every engine has answered begin (or none was posted): wait_open will not wait."""
        return self._begins is None or all(future.done() for _, future in self._begins)

    def wait_open(self) -> None:
        """Return once every engine's begin answered; WeightSyncError naming the first that refused
        (the others stay in `opened`, for end)."""
        if self._begins is None:
            return
        begins, self._begins = self._begins, None
        deadline = time.monotonic() + self.timeout_s
        errors = []
        for client, (url, future) in zip(self.clients, begins):
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
                self.opened.append(client)
            except TimeoutError:
                errors.append(f"begin_weight_update: {url} did not answer within {self.timeout_s:.0f}s")
            except Exception as exc:  # an EngineError's message starts with the URL and endpoint
                errors.append(f"begin_weight_update: {exc}")
        if errors:
            raise WeightSyncError(errors[0])

    def end(self) -> str | None:
        """End the session on the engines that opened it (after a failed begin: those only); the
        problem as one line, or None. Waits for begins still in flight first, so that no end can
        overtake its begin."""
        try:
            self.wait_open()
        except WeightSyncError:
            pass  # reported by whoever waited first; end the sessions that did open
        opened, self.opened = self.opened, []
        if not opened:
            return None
        try:
            call_all(opened, self.timeout_s, EngineClient.end_weight_update)
        except WeightSyncError as exc:
            return str(exc)
        return None
