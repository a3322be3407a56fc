"""weight_sync/engine_session.py: the stage lead's session on every engine. Stand-in clients answer
begin after a delay or refuse it, and record the order of calls; the real engines' side (begin, the
updates, end from the lead) is covered by tests/integration/test_weight_sync.py."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from lean_rl.backends.sglang.client_errors import EngineHTTPError
from lean_rl.weight_sync.engine_session import EngineSession
from lean_rl.weight_sync.errors import WeightSyncError


class Client:
    def __init__(self, url: str, log: list[str], refuse_begin: bool = False, begin_delay_s: float = 0.0):
        self.base_url, self.log, self.refuse_begin, self.begin_delay_s = url, log, refuse_begin, begin_delay_s

    def submit(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        method = fn.__name__

        def answer():
            if method == "begin_weight_update" and self.refuse_begin:
                self.log.append(f"{self.base_url} {method} refused")
                future.set_exception(EngineHTTPError(self.base_url, "/begin_weight_update", 400, "already open"))
                return
            self.log.append(f"{self.base_url} {method}")
            future.set_result({"success": True})

        if method == "begin_weight_update" and self.begin_delay_s:
            threading.Timer(self.begin_delay_s, answer).start()
        else:
            answer()
        return future


def test_begin_returns_at_once_and_end_waits_for_it():
    log: list[str] = []
    session = EngineSession([Client("e0", log, begin_delay_s=0.2), Client("e1", log)], timeout_s=5)
    session.begin()
    assert log == ["e1 begin_weight_update"]  # e0's begin still in flight: the lead goes on exporting
    assert session.end() is None  # end cannot overtake a begin
    assert log[:2] == ["e1 begin_weight_update", "e0 begin_weight_update"]
    assert sorted(log[2:]) == ["e0 end_weight_update", "e1 end_weight_update"]
    assert session.end() is None and len(log) == 4  # nothing left open: no second end


def test_a_refused_begin_names_the_engine_and_only_the_opened_sessions_end():
    log: list[str] = []
    session = EngineSession([Client("e0", log, refuse_begin=True), Client("e1", log)], timeout_s=5)
    session.begin()
    with pytest.raises(WeightSyncError, match="begin_weight_update: e0.*already open"):
        session.wait_open()
    assert session.end() is None
    assert "e0 end_weight_update" not in log and log[-1] == "e1 end_weight_update"


def test_a_later_stage_ends_the_session_the_first_stage_opened():
    log: list[str] = []
    session = EngineSession([Client("e0", log), Client("e1", log)], timeout_s=5)
    session.adopt()
    session.wait_open()  # nothing to wait for
    assert session.end() is None
    assert sorted(log) == ["e0 end_weight_update", "e1 end_weight_update"]
